"""Rollout–training mismatch correction (algorithms/mismatch.py) against hand-computed cases, in float64, with
poison values on padding."""

import math

import torch

from dtppo.algorithms.advantages import group_normalized_advantages
from dtppo.algorithms.losses import policy_loss
from dtppo.algorithms.mismatch import mismatch_sample_mask, rollout_is_stats, rollout_is_weights, seq_mult_prob_error
from dtppo.types import Experience

POISON = 1e4  # on padding: any leak shows up as an absurd number


def _pair():
    """Row 0: log π_old − log π_gen = (0.5, −0.3, 1.0) then padding; row 1: (−0.2, −0.2), then padding;
    row 2: no response token."""
    gen = torch.tensor([[-1.0, -2.0, -3.0, POISON], [-0.5, -0.5, POISON, POISON], [POISON] * 4], dtype=torch.float64)
    old = torch.tensor(
        [[-0.5, -2.3, -2.0, -POISON], [-0.7, -0.7, -POISON, -POISON], [-POISON] * 4], dtype=torch.float64
    )
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)
    return gen, old, mask


def test_seq_mult_prob_error_by_hand():
    gen, old, mask = _pair()
    error = seq_mult_prob_error(gen, old, mask)
    expected = [(math.exp(0.5) + math.exp(0.3) + math.exp(1.0)) / 3, math.exp(0.2), 1.0]
    assert torch.allclose(error, torch.tensor(expected, dtype=torch.float64), atol=1e-12)
    assert mismatch_sample_mask(error, 1.5).tolist() == [0.0, 1.0, 1.0]  # (1.65 + 1.35 + 2.72) / 3 = 1.91 > 1.5
    assert mismatch_sample_mask(error, 2.0).tolist() == [1.0, 1.0, 1.0]


def test_token_weights_are_truncated_ratios():
    gen, old, mask = _pair()
    weights = rollout_is_weights(old, gen, mask, "token", cap=2.0)
    expected = torch.tensor(
        [[math.exp(0.5), math.exp(-0.3), 2.0, 0], [math.exp(-0.2), math.exp(-0.2), 0, 0], [0, 0, 0, 0]],
        dtype=torch.float64,
    )
    assert torch.allclose(weights, expected, atol=1e-12)


def test_sequence_weights_are_the_truncated_product():
    gen, old, mask = _pair()
    weights = rollout_is_weights(old, gen, mask, "sequence", cap=2.0)
    # Row 0: exp(0.5 − 0.3 + 1.0) = 3.32 -> 2 on each token; row 1: exp(−0.4) = 0.670 on each token.
    expected = torch.tensor(
        [[2.0, 2.0, 2.0, 0], [math.exp(-0.4), math.exp(-0.4), 0, 0], [0, 0, 0, 0]], dtype=torch.float64
    )
    assert torch.allclose(weights, expected, atol=1e-12)
    long = rollout_is_weights(torch.zeros(1, 500), -torch.ones(1, 500), torch.ones(1, 500), "sequence", cap=3.0)
    assert torch.allclose(long, torch.full((1, 500), 3.0))  # exp(500) would overflow; the cap is applied in log space


def test_weights_carry_no_gradient_and_scale_the_policy_loss():
    """Ratio 1, A = (1, −2), weights (2, 0.5): L = Σ −A·w·r = −2 + 1 = −1; ∂L/∂log π = −A·w = (−2, 1). Unweighted:
    L = 1, gradient (−1, 2). The weights are constants: old log-probs get no gradient through them."""
    old = torch.tensor([[-1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    gen = torch.tensor([[-1.0 - math.log(2.0), -1.0 + math.log(2.0)]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.float64)
    weights = rollout_is_weights(old, gen, mask, "token", cap=4.0)
    assert not weights.requires_grad and torch.allclose(weights, torch.tensor([[2.0, 0.5]], dtype=torch.float64))
    advantages = torch.tensor([[1.0, -2.0]], dtype=torch.float64)
    for w, loss_expected, grad_expected in [(weights, -1.0, [-2.0, 1.0]), (None, 1.0, [-1.0, 2.0])]:
        logprobs = old.detach().clone().requires_grad_(True)
        loss, stats = policy_loss(logprobs, old.detach(), advantages, mask, 0.2, 0.2, gen_logprobs=gen, is_weights=w)
        loss.backward()
        assert abs(float(loss.detach()) - loss_expected) < 1e-12
        assert torch.allclose(logprobs.grad, torch.tensor([grad_expected], dtype=torch.float64), atol=1e-12)
        assert float(stats["probs_ratio_sum"]) == 2.0  # statistics stay unweighted


def test_rollout_is_stats_by_hand():
    gen, old, mask = _pair()
    weights = rollout_is_weights(old, gen, mask, "token", cap=2.0).float()
    stats = rollout_is_stats(weights, mask.float(), cap=2.0)
    values = [math.exp(0.5), math.exp(-0.3), 2.0, math.exp(-0.2), math.exp(-0.2)]
    assert abs(float(stats["mean"]) - sum(values) / 5) < 1e-6
    assert abs(float(stats["min"]) - math.exp(-0.3)) < 1e-6 and abs(float(stats["max"]) - 2.0) < 1e-6
    assert abs(float(stats["capped_frac"]) - 1 / 5) < 1e-6  # one of five tokens hit the cap


def test_grpo_group_statistics_leave_out_masked_samples():
    """Group (1, 0, 1, 1) with the last sample masked: mean 2/3 and unbiased std sqrt(1/3) over (1, 0, 1); the
    masked sample gets 0. Without the mask the group is (1, 0, 1, 1): mean 3/4, std 1/2."""
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    mask = torch.ones(4, 2)
    masked = group_normalized_advantages(rewards, mask, 4, sample_mask=torch.tensor([1.0, 1.0, 1.0, 0.0]))
    std = math.sqrt(1 / 3)
    expected = [(1 / 3) / (std + 1e-4), (-2 / 3) / (std + 1e-4), (1 / 3) / (std + 1e-4), 0.0]
    assert torch.allclose(masked[:, 0], torch.tensor(expected), atol=1e-6)
    plain = group_normalized_advantages(rewards, mask, 4)
    assert torch.allclose(plain[:, 0], torch.tensor([0.25, -0.75, 0.25, 0.25]) / (0.5 + 1e-4), atol=1e-6)


def test_train_mask_is_the_response_mask_times_the_sample_mask():
    exp = Experience(
        input_ids=torch.zeros(2, 3, dtype=torch.long),
        attention_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]),
        response_mask=torch.tensor([[0.0, 1, 1], [0, 1, 0]]),
        gen_logprobs=torch.zeros(2, 3),
        truncated=torch.zeros(2, dtype=torch.bool),
    )
    assert exp.train_mask is exp.response_mask
    masked = exp.replace(sample_mask=torch.tensor([0.0, 1.0]))
    assert masked.train_mask.tolist() == [[0, 0, 0], [0, 1, 0]]
    assert masked.slice(1, 2).train_mask.tolist() == [[0, 1]]  # travels with the rows (trimmed to the longest)
