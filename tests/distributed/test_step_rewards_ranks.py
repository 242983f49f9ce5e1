"""Step rewards across ranks: on 2 gloo ranks rank 0 alone scores the batch and places its steps (``reward_phase``),
every rank receives them, and GAE with step rewards and GRPO's process supervision give on each rank what one
process gives, equal to the float64 reference loops (tests/support/advantage_references.py). Rows have prompts of
different lengths (the padded layout; the estimators run before any packing)."""

import json
import tempfile
from pathlib import Path

import torch

from dtppo.distributed.comm import rank
from dtppo.distributed.ranks import run_ranks
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.ppo.advantage_estimator import GAEEstimator, GRPOEstimator
from dtppo.ppo.reward_phase import score_batch, shared, with_rewards
from dtppo.rewards.rewarder import RewardBreakdown
from dtppo.types import Experience
from tests.support.advantage_references import reference_gae_returns, reference_process

PROMPTS = ["What is 1+2?", "Add:", "Sum 3 and 4, then double.", "Go"]
ANSWERS = ["1+2=3\n#### 3", "x\ny\nz", "3+4=7\n7*2=14\n#### 14", "####"]
OUTCOME = [1.0, 0.0, 1.0, -0.5]
GAMMA, LAM = 0.9, 0.95


def line_steps(text: str) -> tuple[tuple[int, float], ...]:
    """A step at the end of each line but the last, worth 0.1 times its line number."""
    ends, start = [], 0
    for line in text.split("\n")[:-1]:
        start += len(line)
        ends.append(start)
        start += 1
    return tuple((end, 0.1 * (k + 1)) for k, end in enumerate(ends))


class LineRewarder:
    """A stand-in ``Rewarder``: the outcome of each answer from OUTCOME, its line ends as steps."""

    gave_steps = False

    def score(self, problems, texts, while_scoring=None) -> RewardBreakdown:
        if while_scoring is not None:
            while_scoring()
        steps = [line_steps(t) for t in texts]
        self.gave_steps = any(steps)
        failed = torch.zeros(len(texts), dtype=torch.bool)
        return RewardBreakdown(torch.tensor(OUTCOME), steps, {"lines": steps}, failed, {})


def batch() -> tuple[Experience, list[int]]:
    """The rows ``[prompt | answer | pad]`` (character tokens) and each prompt's length."""
    tok = build_char_tokenizer()
    rows = [
        tok.encode(p, add_special_tokens=False) + tok.encode(a, add_special_tokens=False)
        for p, a in zip(PROMPTS, ANSWERS)
    ]
    width = max(map(len, rows)) + 2
    ids = torch.full((len(rows), width), tok.pad_token_id)
    attention, response = torch.zeros(ids.shape, dtype=torch.long), torch.zeros(ids.shape)
    for b, (row, prompt) in enumerate(zip(rows, PROMPTS)):
        ids[b, : len(row)], attention[b, : len(row)], response[b, len(prompt) : len(row)] = torch.tensor(row), 1, 1.0
    values = torch.linspace(-0.4, 0.6, ids.numel()).reshape(ids.shape) * response
    experience = Experience(ids, attention, response, torch.zeros(ids.shape), torch.zeros(len(rows), dtype=torch.bool))
    return experience.replace(old_values=values), [len(p) for p in PROMPTS]


def _estimate(out_dir: str) -> None:
    tok = build_char_tokenizer()
    experience, _ = batch()
    rewards = score_batch(LineRewarder(), tok, experience, [None] * 4)[1] if rank() == 0 else None
    experience = with_rewards(experience, shared(rewards, experience), torch.zeros(4))
    gae = GAEEstimator(GAMMA, LAM, LAM, False, 0.0, 0.0, "k1")(experience)
    grpo = GRPOEstimator(group_size=2)(experience)
    record = {
        "step_rewards": experience.step_rewards.tolist(),
        "step_mask": experience.step_mask.tolist(),
        "returns": gae.returns.tolist(),
        "advantages": gae.advantages.tolist(),
        "process": grpo.advantages.tolist(),
    }
    Path(out_dir, f"rank{rank()}.json").write_text(json.dumps(record))


def test_each_rank_gets_rank_zeros_steps_and_the_estimators_match_the_references():
    with tempfile.TemporaryDirectory() as out:
        run_ranks(_estimate, 2, out)
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(2)]
        _estimate(out)
        alone = json.loads(Path(out, "rank0.json").read_text())
    assert ranks[0] == ranks[1] == alone  # bit for bit: rank 1 never scored
    experience, prompt_lengths = batch()
    mask = experience.response_mask
    # each step on the token holding its last character: a character tokenizer's token prompt + end - 1
    steps = {(b, prompt_lengths[b] + end - 1): r for b, a in enumerate(ANSWERS) for end, r in line_steps(a)}
    assert len(steps) == 5 and sum(map(sum, alone["step_mask"])) == 5
    token_rewards = torch.zeros(mask.shape, dtype=torch.float64)
    for (b, t), r in steps.items():
        token_rewards[b, t] += r
    for b in range(4):
        token_rewards[b, int(mask[b].nonzero().max())] += OUTCOME[b]
    values = experience.old_values.double()
    returns = reference_gae_returns(token_rewards, values, mask, GAMMA, LAM)
    torch.testing.assert_close(
        torch.tensor(alone["returns"], dtype=torch.float64) * mask, returns, rtol=1e-5, atol=1e-6
    )
    advantages = (returns - values) * mask
    torch.testing.assert_close(torch.tensor(alone["advantages"], dtype=torch.float64), advantages, rtol=1e-5, atol=1e-6)
    process = reference_process(mask, torch.tensor(OUTCOME), steps, group_size=2)
    torch.testing.assert_close(torch.tensor(alone["process"], dtype=torch.float64), process, rtol=1e-5, atol=1e-6)
