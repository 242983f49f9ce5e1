"""GRPO with process supervision (``process_supervised_advantages``) and GAE with step rewards, each against a float64
reference loop written from the papers' definitions, on hand-made padded batches with poison where nothing may read."""

from __future__ import annotations

import torch

from dtppo.algorithms.advantages import (
    compute_gae,
    group_normalized_advantages,
    process_supervised_advantages,
    token_level_rewards,
)
from tests.support.advantage_references import reference_gae_returns, reference_process

POISON = 1.0e4
# Two prompts x G = 3, width 7. Responses at columns 1..5 with different lengths; 0 and the tail are prompt or pad.
MASK = torch.tensor(
    [
        [0, 1, 1, 1, 1, 0, 0],
        [0, 1, 1, 0, 0, 0, 0],
        [0, 1, 1, 1, 1, 1, 0],
        [0, 1, 1, 1, 0, 0, 0],
        [0, 1, 0, 0, 0, 0, 0],
        [0, 1, 1, 1, 1, 1, 1],
    ],
    dtype=torch.float32,
)
OUTCOME = torch.tensor([1.0, 0.0, 1.0, 0.5, -1.0, 0.0])
STEPS = {(0, 2): 0.5, (0, 3): -0.25, (2, 1): 1.0, (2, 4): 0.5, (3, 2): 0.2, (5, 3): -0.5, (5, 5): 0.3}


def _steps() -> tuple[torch.Tensor, torch.Tensor]:
    rewards, mask = torch.zeros(MASK.shape), torch.zeros(MASK.shape)
    for (b, t), r in STEPS.items():
        rewards[b, t], mask[b, t] = r, 1.0
    # poison where no step is marked: off the response, and inside it where the mask says no step
    rewards = torch.where(mask.bool(), rewards, POISON)
    return rewards, mask


def _reference_process(sample_mask: list[int] | None = None, later: bool = True) -> torch.Tensor:
    return reference_process(MASK, OUTCOME, STEPS, 3, sample_mask, later)


def test_process_supervision_matches_the_reference_loop():
    rewards, mask = _steps()
    got = process_supervised_advantages(OUTCOME, rewards, mask, MASK, group_size=3)
    torch.testing.assert_close(got.double(), _reference_process(), rtol=1e-5, atol=1e-6)
    assert got.dtype == torch.float32 and torch.equal(got[~MASK.bool()], torch.zeros(int((MASK == 0).sum())))


def test_left_out_samples_leave_the_statistics_and_get_zero():
    rewards, mask = _steps()
    keep = [1, 0, 1, 1, 1, 0]
    got = process_supervised_advantages(OUTCOME, rewards, mask, MASK, 3, sample_mask=torch.tensor(keep).float())
    torch.testing.assert_close(got.double(), _reference_process(keep), rtol=1e-5, atol=1e-6)
    assert got[1].abs().sum() == 0 and got[5].abs().sum() == 0


def test_without_steps_it_is_outcome_grpo_exactly():
    none = torch.zeros(MASK.shape)
    got = process_supervised_advantages(OUTCOME, none + POISON, none, MASK, group_size=3)
    assert torch.allclose(got, group_normalized_advantages(OUTCOME, MASK, group_size=3), rtol=1e-6, atol=1e-6)


def test_the_reference_tells_later_steps_from_earlier_ones():
    # negative control: crediting each step to the tokens after it (the wrong way round) is told apart
    rewards, mask = _steps()
    got = process_supervised_advantages(OUTCOME, rewards, mask, MASK, 3).double()
    assert not torch.allclose(got, _reference_process(later=False), atol=1e-3)


def test_gae_with_step_rewards_matches_the_reference_loop():
    rewards, mask = _steps()
    values = torch.linspace(-0.5, 0.5, MASK.numel()).reshape(MASK.shape)
    token_rewards = token_level_rewards(OUTCOME, MASK) + torch.where(mask.bool(), rewards, 0.0)
    for gamma, lam in [(1.0, 1.0), (0.9, 0.95)]:
        _, returns = compute_gae(token_rewards, values, MASK, gamma, lam)
        expected = reference_gae_returns(token_rewards.double(), values.double(), MASK, gamma, lam)
        torch.testing.assert_close(returns.double() * MASK, expected, rtol=1e-5, atol=1e-6)
