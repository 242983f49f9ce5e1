import pytest
import torch

from dtppo.algorithms.advantages import (
    compute_advantages,
    compute_gae,
    first_token_abs_mean,
    group_normalized_advantages,
    length_adaptive_lambda,
    outcome_returns,
    right_shift_values,
    token_level_rewards,
    whiten,
)


def test_right_shift_values_2d():
    v = torch.tensor([[1.0, 2, 3, 4], [5, 6, 7, 8]])
    assert torch.equal(right_shift_values(v), torch.tensor([[0.0, 1, 2, 3], [0, 5, 6, 7]]))


def test_right_shift_values_keeps_trailing_dim():
    v = torch.tensor([[1.0, 2, 3, 4], [5, 6, 7, 8]]).unsqueeze(-1)
    out = right_shift_values(v)
    assert out.shape == (2, 4, 1)
    assert torch.equal(out.squeeze(-1), torch.tensor([[0.0, 1, 2, 3], [0, 5, 6, 7]]))


def test_gae_gamma_lambda_zero_is_one_step_td():
    # γ = λ = 0: A_t = r_t − V_t at every valid token.
    r = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    v = torch.tensor([[0.5, 0.2, 0.3, 9.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    adv, ret = compute_gae(r, v, m, gamma=0.0, lam=0.0)
    assert torch.allclose(adv, torch.tensor([[-0.5, -0.2, 0.7, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[0.0, 0.0, 1.0, 0.0]]))


def test_gae_gamma_lambda_one_gives_monte_carlo_returns():
    r = torch.tensor([[0.0, 0.5, 0.0, 2.0], [1.0, 0.0, 3.0, 0.0]])
    v = torch.tensor([[0.3, -0.2, 0.7, 0.1], [0.4, 0.4, 0.4, 0.4]])
    m = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0]])
    adv, ret = compute_gae(r, v, m, gamma=1.0, lam=1.0)
    expected_returns = torch.tensor([[2.5, 2.5, 2.0, 2.0], [4.0, 3.0, 3.0, 0.0]])
    assert torch.allclose(ret, expected_returns)
    assert torch.allclose(adv, (expected_returns - v) * m)


def test_gae_hand_computed_gamma_lambda():
    # γ = 0.9, λ = 0.5, three valid tokens, reward 1 at the end, no bootstrap past the last token.
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.2, 0.4, 0.6]])
    m = torch.ones(1, 3)
    adv, _ = compute_gae(r, v, m, gamma=0.9, lam=0.5)
    d2 = 1.0 - 0.6
    d1 = 0.0 + 0.9 * 0.6 - 0.4
    d0 = 0.0 + 0.9 * 0.4 - 0.2
    a2 = d2
    a1 = d1 + 0.45 * a2
    a0 = d0 + 0.45 * a1
    assert torch.allclose(adv, torch.tensor([[a0, a1, a2]]))


@pytest.mark.parametrize("poison", [999.0, float("nan"), -1e9])
def test_gae_masked_gap_is_skipped(poison):
    # A gap (masked interior position) must act as if absent: a poison value there changes nothing.
    r = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    m = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    v_clean = torch.tensor([[0.1, 0.0, 0.3, 0.5]])
    v_poison = v_clean.clone()
    v_poison[0, 1] = poison
    for gamma, lam in [(1.0, 1.0), (0.9, 0.8)]:
        adv_a, ret_a = compute_gae(r, v_clean, m, gamma, lam)
        adv_b, ret_b = compute_gae(r, v_poison, m, gamma, lam)
        assert torch.equal(adv_a, adv_b) and torch.equal(ret_a, ret_b)
        # and equals the same row with the gap removed
        adv_c, _ = compute_gae(r[:, [0, 2, 3]], v_clean[:, [0, 2, 3]], torch.ones(1, 3), gamma, lam)
        assert torch.allclose(adv_a[:, [0, 2, 3]], adv_c)
        assert adv_a[0, 1] == 0


def test_gae_per_sample_lambda_tensor():
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    v = torch.tensor([[0.2, 0.4, 0.6], [0.2, 0.4, 0.6]])
    m = torch.ones(2, 3)
    adv, _ = compute_gae(r, v, m, 0.9, torch.tensor([0.0, 1.0]))
    adv0, _ = compute_gae(r[:1], v[:1], m[:1], 0.9, 0.0)
    adv1, _ = compute_gae(r[1:], v[1:], m[1:], 0.9, 1.0)
    assert torch.allclose(adv, torch.cat([adv0, adv1]))


def test_decoupled_lambda_returns_from_value_lambda():
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.2, 0.4, 0.6]])
    m = torch.ones(1, 3)
    adv, ret = compute_advantages(r, v, m, 1.0, lambda_policy=0.5, lambda_value=1.0, normalize=False)
    assert torch.allclose(ret, torch.ones(1, 3))  # λ_value = 1: Monte-Carlo
    expected_adv, _ = compute_gae(r, v, m, 1.0, 0.5)
    assert torch.allclose(adv, expected_adv)
    assert not torch.allclose(adv + v, ret)


def test_length_adaptive_lambda():
    lam = length_adaptive_lambda(torch.tensor([1, 10, 100]), alpha=0.5)
    assert torch.allclose(lam, torch.tensor([0.0, 0.8, 0.98]))


def test_whiten_masked_mean_zero_unbiased_std_one():
    torch.manual_seed(0)
    x = torch.randn(4, 7) * 3 + 2
    m = (torch.rand(4, 7) > 0.3).float()
    w = whiten(x, m)
    valid = w[m.bool()]
    assert abs(valid.mean().item()) < 1e-6
    assert abs(valid.std(unbiased=True).item() - 1) < 1e-5
    assert torch.all(w[~m.bool()] == 0)


@pytest.mark.parametrize("value, n", [(0.7, 1000), (1.3, 13), (0.3, 7), (-0.45, 1000)])
def test_whiten_without_signal_gives_zero(value, n):
    # All advantages equal: the float32 mean can be an ulp off, so x − mean is ~1e-8 instead of 0. Dividing
    # that by (σ + 1e-8) with σ ~ 1e-8 gave ±0.4..0.9 per token; rsqrt(σ² + 1e-8) scales it by at most 1e4,
    # so a mean a few ulps off stays ~1e-3.
    x = torch.full((2, n), value)
    x[1, n // 2 :] = 999.0  # poison on padding
    m = torch.ones(2, n)
    m[1, n // 2 :] = 0
    w = whiten(x, m)
    assert w.abs().max().item() < 1e-2
    assert torch.all(w[~m.bool()] == 0)


def test_whiten_matches_the_float64_reference_formula():
    # NeMo-RL / verl: A = (A − μ)·rsqrt(σ²_unbiased + 1e-8), masked positions 0.
    torch.manual_seed(3)
    x = torch.randn(3, 9) * 0.01  # small σ, so the ε term is visible at float32 precision
    m = (torch.rand(3, 9) > 0.3).float()
    valid = x.double()[m.bool()]
    expected = (x.double() - valid.mean()) * torch.rsqrt(valid.var(unbiased=True) + 1e-8) * m
    torch.testing.assert_close(whiten(x, m).double(), expected, rtol=1e-5, atol=1e-6)


def test_token_level_rewards_on_last_response_token_with_kl():
    mask = torch.tensor([[0.0, 1, 1, 0], [0, 0, 1, 1]])
    kl = torch.full((2, 4), 0.5)
    out = token_level_rewards(torch.tensor([1.0, 2.0]), mask, kl, kl_coef=0.1)
    assert torch.allclose(out, torch.tensor([[0.0, -0.05, 0.95, 0], [0, 0, -0.05, 1.95]]))
    assert torch.equal(token_level_rewards(torch.tensor([3.0]), torch.zeros(1, 3)), torch.zeros(1, 3))


@pytest.mark.parametrize("poison", [999.0, float("nan")])
def test_group_normalized_advantages_hand_computed(poison):
    # Two prompts x G=3 samples. Group 1: rewards 1, 0, 0 -> mean 1/3, unbiased std sqrt(1/3).
    # Group 2: all equal -> 0 everywhere (no signal), not 0/0.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    mask = torch.tensor(
        [[0, 1, 1, 0], [0, 1, 0, 0], [1, 1, 1, 1], [0, 0, 1, 1], [1, 0, 0, 0], [0, 1, 1, 0]], dtype=torch.float32
    )
    adv = group_normalized_advantages(rewards, mask, group_size=3)
    std = (1.0 / 3.0) ** 0.5  # sqrt(((2/3)^2 + 2 (1/3)^2) / (3 - 1))
    per_sample = torch.tensor(
        [(2 / 3) / (std + 1e-4), -(1 / 3) / (std + 1e-4), -(1 / 3) / (std + 1e-4), 0, 0, 0], dtype=torch.float64
    )
    expected = per_sample[:, None] * mask.double()
    torch.testing.assert_close(adv.double(), expected, rtol=1e-6, atol=1e-7)
    assert adv.dtype == torch.float32 and torch.equal(adv[3:], torch.zeros(3, 4))
    # The mask alone decides where advantages live: poison in the shape the rewards do not touch changes nothing.
    holes = mask.clone()
    holes[2, 1] = 0.0
    poisoned = group_normalized_advantages(rewards, holes, group_size=3)
    assert poisoned[2, 1] == 0.0 and torch.equal(poisoned[holes.bool()], adv[holes.bool()])
    # A poisoned reward of one group cannot leak into another group.
    bad = rewards.clone()
    bad[0] = poison
    leaked = group_normalized_advantages(bad, mask, group_size=3)
    assert torch.equal(leaked[3:], adv[3:])


def test_group_normalized_advantages_two_samples_are_plus_minus_one():
    # G = 2 with rewards (1, 0): mean 1/2, unbiased std 1/sqrt(2) -> ±(1/2)·sqrt(2)/(1 + 1e-4·sqrt(2)) ~ ±0.7070.
    adv = group_normalized_advantages(torch.tensor([1.0, 0.0]), torch.ones(2, 2), group_size=2)
    value = 0.5 / (0.5**0.5 + 1e-4)
    torch.testing.assert_close(adv, torch.tensor([[value, value], [-value, -value]]))


@pytest.mark.parametrize("poison", [999.0, float("nan")])
def test_first_token_abs_mean_reads_the_first_response_token(poison):
    adv = torch.tensor([[poison, -2.0, 5.0, poison], [poison, poison, 0.5, 7.0], [poison, poison, poison, poison]])
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1], [0, 0, 0, 0]], dtype=torch.float32)
    # Rows 0 and 1 have responses (first tokens -2.0 and 0.5); the empty row 2 is left out of the mean.
    assert first_token_abs_mean(adv, mask).item() == pytest.approx((2.0 + 0.5) / 2)
    assert first_token_abs_mean(adv, torch.zeros_like(mask)).item() == 0.0


@pytest.mark.parametrize("poison", [999.0, float("nan")])
def test_outcome_returns_discount_the_reward_back_over_valid_tokens_only(poison):
    mask = torch.tensor([[0.0, 1.0, 0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]])
    out = outcome_returns(torch.tensor([2.0, -1.0]), mask, gamma=0.5)
    assert torch.allclose(out, torch.tensor([[0.0, 0.5, 0.0, 1.0, 2.0, 0.0], [-0.5, -1.0, 0.0, 0.0, 0.0, 0.0]]))
    # a row's return does not depend on another row's reward (poison there changes nothing here)
    other = outcome_returns(torch.tensor([2.0, poison]), mask, gamma=0.5)
    assert torch.equal(other[0], out[0])
