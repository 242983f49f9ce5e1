"""V-trace (``compute_vtrace``) against a float64 loop written from the paper's definition, a hand-computed case,
masks and poison, and exact equality with GAE when the behaviour policy is the trained one. The estimator that
chooses V-trace: tests/unit/ppo/test_advantage_estimator.py."""

import math

import pytest
import torch

from dtppo.algorithms.advantages import (
    VTraceCorrection,
    compute_advantages,
    compute_gae,
    compute_vtrace,
)


def vtrace_reference(rewards, values, log_rho, mask, gamma, lam, rho_cap, c_cap):
    """Espeholt et al. (2018) eq. 1 with λ in the traces, summed explicitly in float64 over each row's valid tokens
    (masked positions are absent): v_s − V_s = Σ_{t≥s} γ^{t−s} (Π_{i=s}^{t−1} c_i) ρ_t δ_t."""
    batch, seq_len = values.shape
    advantages = torch.zeros(batch, seq_len, dtype=torch.float64)
    for b in range(batch):
        lam_b = float(lam[b]) if isinstance(lam, torch.Tensor) else lam
        idx = [t for t in range(seq_len) if mask[b, t]]
        v = [float(values[b, t]) for t in idx]
        r = [float(rewards[b, t]) for t in idx]
        ratio = [math.exp(float(log_rho[b, t])) for t in idx]
        n = len(idx)
        for s in range(n):
            total, trace = 0.0, 1.0
            for t in range(s, n):
                next_v = v[t + 1] if t + 1 < n else 0.0
                delta = r[t] + gamma * next_v - v[t]
                total += gamma ** (t - s) * trace * min(rho_cap, ratio[t]) * delta
                trace *= lam_b * min(c_cap, ratio[t])
            advantages[b, idx[s]] = total
    returns = torch.where(mask.bool(), advantages + values.double(), 0.0)
    return advantages, returns


def _case(seed=0, batch=4, seq_len=9):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(batch, seq_len, generator=g)
    rewards = torch.randn(batch, seq_len, generator=g)
    log_rho = 0.8 * torch.randn(batch, seq_len, generator=g)
    # rows like right-padded [prompt | response | pad]: different prompt and response lengths, one with a gap
    mask = torch.zeros(batch, seq_len)
    for b, (start, stop) in enumerate([(2, 9), (0, 4), (3, 6), (1, 8)][:batch]):
        mask[b, start:stop] = 1.0
    mask[3, 4] = 0.0
    return rewards * mask, values, log_rho, mask


@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.9, 0.8), (0.7, 0.0), (1.0, torch.tensor([1.0, 0.5, 0.9, 0.2]))])
@pytest.mark.parametrize("rho_cap, c_cap", [(1.0, 1.0), (2.0, 0.5), (0.6, 1.5), (1e6, 1e6)])
def test_vtrace_matches_the_float64_definition(gamma, lam, rho_cap, c_cap):
    rewards, values, log_rho, mask = _case()
    adv, ret = compute_vtrace(rewards, values, log_rho, mask, gamma, lam, rho_cap, c_cap)
    ref_adv, ref_ret = vtrace_reference(rewards, values, log_rho, mask, gamma, lam, rho_cap, c_cap)
    assert adv.dtype == ret.dtype == torch.float32
    assert torch.allclose(adv.double(), ref_adv, atol=2e-5, rtol=1e-5)
    assert torch.allclose(ret.double(), ref_ret, atol=2e-5, rtol=1e-5)
    assert (adv[mask == 0] == 0).all() and (ret[mask == 0] == 0).all()


def test_vtrace_hand_computed_with_capped_ratios():
    # three valid tokens after a one-token prompt; γ = 0.9, λ = 0.5, ρ̄ = 1, c̄ = 1; ratios 2 (capped), 0.5, 1.5 (capped)
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[7.0, 0.2, 0.4, 0.6]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    log_rho = torch.log(torch.tensor([[3.0, 2.0, 0.5, 1.5]]))
    adv, ret = compute_vtrace(rewards, values, log_rho, mask, gamma=0.9, lam=0.5, rho_cap=1.0, c_cap=1.0)
    d3 = 1.0 - 0.6
    d2 = 0.9 * 0.6 - 0.4
    d1 = 0.9 * 0.4 - 0.2
    a3 = 1.0 * d3
    a2 = 0.5 * d2 + 0.9 * (0.5 * 0.5) * a3  # ρ_2 = 0.5, c_2 = λ·0.5
    a1 = 1.0 * d1 + 0.9 * (0.5 * 1.0) * a2  # ρ_1 = min(1, 2), c_1 = λ·min(1, 2)
    assert torch.allclose(adv, torch.tensor([[0.0, a1, a2, a3]]), atol=1e-7)
    assert torch.allclose(ret, torch.tensor([[0.0, a1 + 0.2, a2 + 0.4, a3 + 0.6]]), atol=1e-7)
    # negative control: the trace taken from the next token instead of this one gives other numbers
    wrong_a1 = 1.0 * d1 + 0.9 * (0.5 * 0.5) * a2
    assert abs(adv[0, 1].item() - wrong_a1) > 1e-3


@pytest.mark.parametrize("poison", [999.0, float("nan"), -1e9, float("inf")])
def test_vtrace_ignores_values_and_ratios_on_masked_positions(poison):
    rewards, values, log_rho, mask = _case(seed=1)
    adv, ret = compute_vtrace(rewards, values, log_rho, mask, 0.95, 0.9, 1.0, 1.0)
    poisoned_values, poisoned_rho = values.clone(), log_rho.clone()
    poisoned_values[mask == 0] = poison
    poisoned_rho[mask == 0] = poison
    adv_p, ret_p = compute_vtrace(rewards, poisoned_values, poisoned_rho, mask, 0.95, 0.9, 1.0, 1.0)
    assert torch.equal(adv, adv_p) and torch.equal(ret, ret_p)


def test_vtrace_rows_are_independent_of_the_batch():
    rewards, values, log_rho, mask = _case(seed=2)
    adv, ret = compute_vtrace(rewards, values, log_rho, mask, 0.9, 0.8, 1.0, 1.0)
    for b in range(values.shape[0]):
        one = compute_vtrace(rewards[b : b + 1], values[b : b + 1], log_rho[b : b + 1], mask[b : b + 1], 0.9, 0.8)
        assert torch.equal(one[0], adv[b : b + 1]) and torch.equal(one[1], ret[b : b + 1])


def gae_loop(rewards, values, mask, gamma, lam):
    """GAE's recursion in float32, written on its own (dtppo's compute_gae before V-trace existed): δ_t + γλA_{t+1}
    over the valid tokens, carried across masked ones."""
    batch, seq_len = values.shape
    lam_b = torch.as_tensor(lam, dtype=torch.float32).expand(batch)
    valid = mask.bool()
    next_value, last_adv = torch.zeros(batch), torch.zeros(batch)
    advantages = torch.zeros(batch, seq_len)
    for t in reversed(range(seq_len)):
        v_t = torch.where(valid[:, t], values[:, t], 0.0)
        adv = rewards[:, t] + gamma * next_value - v_t + gamma * lam_b * last_adv
        next_value = torch.where(valid[:, t], v_t, next_value)
        last_adv = torch.where(valid[:, t], adv, last_adv)
        advantages[:, t] = last_adv
    advantages = torch.where(valid, advantages, 0.0)
    return advantages, torch.where(valid, advantages + values, 0.0)


@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.9, 0.8), (0.99, torch.tensor([1.0, 0.5, 0.9, 0.2]))])
def test_vtrace_with_the_behaviour_policy_trained_is_gae_exactly(gamma, lam):
    rewards, values, _, mask = _case(seed=3)
    zero = torch.zeros_like(values)
    want = gae_loop(rewards, values, mask, gamma, lam)
    for caps in [(1.0, 1.0), (2.0, 3.0)]:
        got = compute_vtrace(rewards, values, zero, mask, gamma, lam, *caps)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    gae = compute_gae(rewards, values, mask, gamma, lam)
    assert torch.equal(gae[0], want[0]) and torch.equal(gae[1], want[1])
    # and any other ratio changes them (the test can fail)
    off = compute_vtrace(rewards, values, torch.full_like(values, -0.3), mask, gamma, lam)
    assert not torch.equal(off[0], want[0])


def test_decoupled_lambdas_take_both_passes_from_vtrace():
    rewards, values, log_rho, mask = _case(seed=4)
    correction = VTraceCorrection(log_rho, 1.0, 1.0)
    adv, ret = compute_advantages(rewards, values, mask, 1.0, 0.9, 0.6, normalize=False, vtrace=correction)
    assert torch.equal(adv, compute_vtrace(rewards, values, log_rho, mask, 1.0, 0.9)[0])
    assert torch.equal(ret, compute_vtrace(rewards, values, log_rho, mask, 1.0, 0.6)[1])
