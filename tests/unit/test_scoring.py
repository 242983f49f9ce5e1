import time

import torch

from dtppo.config import RewardConfig
from dtppo.rewards.scoring import RewardScorer, score_responses

RESPONSES = ["#### 3", "1 + 2 = 3\n#### 3", "#### 4", "\\boxed{\\frac{6}{2}}", "no answer", "#### 3.0", "x"] * 5
TRUTHS = ["3"] * len(RESPONSES)


def test_process_pool_scores_like_the_trainer_process():
    expected = score_responses(RESPONSES, TRUTHS)
    assert expected.sum() == 4 * 5
    scorer = RewardScorer(RewardConfig(num_workers=2, timeout_s=60), backend="local")
    try:
        assert torch.equal(scorer.score(RESPONSES, TRUTHS), expected)
    finally:
        scorer.close()


def test_late_chunks_score_zero_within_the_time_bound():
    scorer = RewardScorer(RewardConfig(num_workers=2, timeout_s=0.05), backend="local")
    try:
        start = time.monotonic()
        scores = scorer.score(RESPONSES, TRUTHS)  # the fresh pool is still importing math-verify
        assert time.monotonic() - start < 1.0
        assert scores.shape == (len(RESPONSES),) and scores.sum() <= 20
    finally:
        scorer.close()
