import os
import signal
import time

import torch

from dtppo.config import RewardConfig
from dtppo.rewards.scoring import RewardScorer, score_responses

def _gsm8k(scorer: RewardScorer, responses: list, truths: list) -> torch.Tensor:
    """The pool's GSM8K-verifier scores as a [B] tensor, like ``score_responses``'s."""
    (scores,) = scorer.score([None] * len(responses), responses, {"answer": truths})
    return torch.tensor(scores, dtype=torch.float32)


RESPONSES = ["#### 3", "1 + 2 = 3\n#### 3", "#### 4", "\\boxed{\\frac{6}{2}}", "no answer", "#### 3.0", "x"] * 5
TRUTHS = ["3"] * len(RESPONSES)


def test_process_pool_scores_like_the_trainer_process():
    expected = score_responses(RESPONSES, TRUTHS)
    assert expected.sum() == 4 * 5
    scorer = RewardScorer(RewardConfig(num_workers=2, timeout_s=60), backend="local", specs=["gsm8k"])
    try:
        assert torch.equal(_gsm8k(scorer, RESPONSES, TRUTHS), expected)
    finally:
        scorer.close()


def test_late_chunks_score_zero_within_the_time_bound():
    # A 1 ms bound: shipping one 256-pair chunk alone takes longer, so chunks are late on any machine
    # (a bound in the hundreds of ms was met by a fast idle machine and the test could not fail).
    scorer = RewardScorer(RewardConfig(num_workers=2, timeout_s=0.001), backend="local", specs=["gsm8k"])
    try:
        scorer.wait_ready()  # the bound is for scoring; process start-up is waited for, untimed
        many, truths = RESPONSES * 300, TRUTHS * 300
        first_pids = set(scorer.pool.worker_pids)
        start = time.monotonic()
        scores = _gsm8k(scorer, many, truths)
        assert time.monotonic() - start < 2.0  # the bound, then terminating and respawning late processes
        assert scorer.late_chunks > 0 and scores.shape == (len(many),) and scores.sum() < 20 * 300
        # the stuck processes were replaced (that replacements score right is the next test's check)
        scorer.wait_ready()
        assert len(scorer.pool.worker_pids) == 2 and set(scorer.pool.worker_pids).isdisjoint(first_pids) and len(scorer.pool.workers) == 2
    finally:
        scorer.close()


def test_pool_survives_its_workers_being_killed():
    """A killed scoring process (OOM killer, crash) is replaced; the next batch still scores right."""
    scorer = RewardScorer(RewardConfig(num_workers=2, timeout_s=60), backend="local", specs=["gsm8k"])
    try:
        scorer.wait_ready()
        for pid in scorer.pool.worker_pids:
            os.kill(pid, signal.SIGKILL)
        assert torch.equal(_gsm8k(scorer, RESPONSES, TRUTHS), score_responses(RESPONSES, TRUTHS))
        assert scorer.late_chunks == 0
    finally:
        scorer.close()
