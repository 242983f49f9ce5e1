import pytest
import torch

from dtppo.algorithms.kl import kl_k3
from dtppo.algorithms.losses import explained_var, explained_var_from_moments, policy_loss, value_loss


def _policy_reference(lp, old, adv, mask, lo, hi, c):
    lp, old, adv = lp.double(), old.double(), adv.double()
    total = 0.0
    for b in range(lp.shape[0]):
        for t in range(lp.shape[1]):
            if not mask[b, t]:
                continue
            r = torch.exp(lp[b, t] - old[b, t])
            loss = max(-adv[b, t] * r, -adv[b, t] * min(max(r, 1 - lo), 1 + hi))
            if c is not None and adv[b, t] < 0:
                loss = min(loss, -c * adv[b, t])
            total += float(loss)
    return total


def test_policy_loss_matches_float64_reference_asymmetric_and_dual_clip():
    torch.manual_seed(0)
    lp = torch.randn(3, 6) * 0.5
    old = lp + torch.randn(3, 6) * 0.4
    adv = torch.randn(3, 6) * 2
    mask = (torch.rand(3, 6) > 0.2).float()
    for lo, hi, c in [(0.2, 0.2, None), (0.2, 0.28, None), (0.2, 0.2, 3.0), (0.1, 0.3, 1.5)]:
        loss, stats = policy_loss(lp, old, adv, mask, lo, hi, c, gen_logprobs=old)
        assert abs(loss.item() - _policy_reference(lp, old, adv, mask, lo, hi, c)) < 1e-4
        assert stats["probs_ratio_clamped_min"] >= 1 - lo - 1e-6
        assert stats["probs_ratio_clamped_max"] <= 1 + hi + 1e-6


def test_policy_loss_gradient_sign_increases_advantaged_tokens():
    lp = torch.zeros(1, 2, requires_grad=True)
    loss, _ = policy_loss(
        lp, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), 0.2, 0.2, gen_logprobs=torch.zeros(1, 2)
    )
    loss.backward()
    assert lp.grad[0, 0] < 0 < lp.grad[0, 1]  # descent raises log π of the A>0 token, lowers the A<0 one


def test_a_log_ratio_past_the_float32_range_gives_a_finite_loss_and_gradient():
    """A broken old log-prob 100 nats below the current one: the ratio e^100 overflows float32 (the negative control:
    the unclamped objective is inf); the loss clamps the log-ratio to ±20 first and the dual clip bounds the term,
    while the other token's gradient is the plain PPO one."""
    lp = torch.tensor([[-0.5, -0.5]], requires_grad=True)
    old, adv, mask = torch.tensor([[-0.5, -100.5]]), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)
    assert torch.isinf(-adv * torch.exp(lp.detach() - old)).any()
    loss, stats = policy_loss(lp, old, adv, mask, 0.2, 0.2, 3.0, gen_logprobs=old)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all() and all(torch.isfinite(v) for v in stats.values())
    assert loss.item() == pytest.approx(-1.0 + 3.0)  # token 1: -A·r = -1; token 2: the dual clip's -c·A = 3
    assert lp.grad[0, 0].item() == pytest.approx(-1.0) and lp.grad[0, 1].item() == 0.0


def test_policy_loss_in_loss_kl():
    lp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    mask = torch.ones(1, 2)
    base, _ = policy_loss(lp, lp, torch.zeros(1, 2), mask, 0.2, 0.2, gen_logprobs=lp)
    with_kl, _ = policy_loss(lp, lp, torch.zeros(1, 2), mask, 0.2, 0.2, None, ref, 0.1, "k3", gen_logprobs=lp)
    assert abs((with_kl - base).item() - 0.1 * kl_k3(lp, ref).sum().item()) < 1e-6


def test_value_loss_matches_float64_reference():
    torch.manual_seed(1)
    v, old, ret = torch.randn(2, 5), torch.randn(2, 5), torch.randn(2, 5)
    mask = torch.tensor([[1.0, 1, 1, 0, 0], [0, 1, 1, 1, 1]])
    loss, stats = value_loss(v, old, ret, mask, clip=0.5, scale=0.7)
    v64, old64, ret64 = v.double(), old.double(), ret.double()
    vc = old64 + (v64 - old64).clamp(-0.5, 0.5)
    ref = 0.5 * 0.7 * (torch.maximum((v64 - ret64) ** 2, (vc - ret64) ** 2) * mask).sum()
    assert abs(loss.item() - ref.item()) < 1e-5
    active = ((v64 - old64).abs() > 0.5) & ((vc - ret64) ** 2 > (v64 - ret64) ** 2)
    clipped = (active.double() * mask).sum()
    assert clipped > 0
    assert stats["vf_clipfrac_sum"].item() == clipped.item()
    unclipped, _ = value_loss(v, old, ret, mask, clip=None)
    assert abs(unclipped.item() - (0.5 * ((v64 - ret64) ** 2 * mask).sum()).item()) < 1e-5


def test_explained_variance_from_moments():
    # E[R]=1, E[V]=0.5 -> E[R-V]=0.5; E[R^2]=5; E[(R-V)^2]=1.25 -> 1 - (1.25-0.25)/(5-1) = 0.75
    ev = explained_var_from_moments(torch.tensor(1.0), torch.tensor(5.0), torch.tensor(0.5), torch.tensor(1.25))
    assert abs(ev.item() - 0.75) < 1e-6


def test_explained_variance_perfect_fit_with_constant_returns_is_one():
    r = torch.full((2, 3), 0.7)
    assert explained_var(r, r.clone(), torch.ones(2, 3)).item() == 1.0


def test_explained_variance_uses_only_valid_tokens():
    r = torch.tensor([[1.0, 2.0, 3.0, 99.0]])
    v = torch.tensor([[1.0, 2.0, 3.0, -99.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert abs(explained_var(r, v, m).item() - 1.0) < 1e-6
    assert abs(explained_var(r, torch.zeros_like(r), m).item()) < 1e-6  # V = 0 explains nothing


def test_vf_clipfrac_ignores_round_off_inside_the_clip_range():
    torch.manual_seed(2)
    old = torch.randn(4, 50)
    values = old + torch.randn(4, 50) * 1e-7  # the same critic, recomputed
    _, stats = value_loss(values, old, torch.randn(4, 50), torch.ones(4, 50), clip=0.5)
    assert stats["vf_clipfrac_sum"].item() == 0.0


# ---- in-loss KL and approx_entropy against exact expectations over a small categorical distribution.
# Each "sample" y is one token of a vocabulary of 5; the expectation over y ~ π_gen is a weighted sum over the
# whole support, so the checks are exact (float64), not Monte Carlo.

_PI_REF = torch.tensor([0.1, 0.3, 0.2, 0.25, 0.15], dtype=torch.float64)
_PI_GEN = torch.tensor([0.3, 0.1, 0.25, 0.15, 0.2], dtype=torch.float64)
_PI_OLD = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.2], dtype=torch.float64)  # the trainer's recompute, off π_gen


def _expected_over_generator(theta, stat, kl_estimator="k3", kl_coef=0.0, old=_PI_GEN):
    """Σ_y π_gen(y)·f(y) for f = the loss (stat=None) or one statistic of policy_loss on the single token y."""
    logp = torch.log_softmax(theta, dim=-1)
    total = torch.zeros((), dtype=torch.float64)
    for y in range(len(_PI_GEN)):
        one = lambda t: t[y].reshape(1, 1)  # noqa: E731
        loss, stats = policy_loss(
            one(logp),
            one(old.log()),
            torch.zeros(1, 1, dtype=torch.float64),
            torch.ones(1, 1),
            0.2,
            0.2,
            None,
            one(_PI_REF.log()),
            kl_coef,
            kl_estimator,
            gen_logprobs=one(_PI_GEN.log()),
        )
        total = total + _PI_GEN[y] * (loss if stat is None else stats[stat])
    return total


def _exact_kl_gradient(theta):
    """∇_θ KL(π_θ ‖ π_ref) in closed form, π_θ = softmax(θ)."""
    theta = theta.detach().clone().requires_grad_(True)
    pi = torch.softmax(theta, dim=-1)
    (pi * (pi.log() - _PI_REF.log())).sum().backward()
    return theta.grad


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("policy", ["on_generator", "moved"])
@pytest.mark.parametrize("old", ["generator", "recomputed"])
def test_in_loss_kl_gradient_is_the_reverse_kl_gradient(estimator, policy, old):
    # π = π_gen (the first minibatch of a step) and π moved away from it (later minibatches and epochs);
    # π_old = π_gen and π_old ≠ π_gen (the weight must come from the distribution that drew the samples).
    moved = torch.tensor([0.5, -0.3, 0.2, -1.0, 0.4], dtype=torch.float64)
    theta = (_PI_GEN.log() if policy == "on_generator" else moved).clone().requires_grad_(True)
    old_probs = _PI_GEN if old == "generator" else _PI_OLD
    _expected_over_generator(theta, None, estimator, kl_coef=1.0, old=old_probs).backward()
    exact = _exact_kl_gradient(theta)
    assert exact.abs().max() > 0.05  # π is far enough from π_ref that a wrong gradient shows
    torch.testing.assert_close(theta.grad, exact, rtol=1e-10, atol=1e-12)


def test_approx_entropy_is_the_policy_entropy_with_samples_from_the_generator():
    theta = torch.tensor([0.5, -0.3, 0.2, -1.0, 0.4], dtype=torch.float64)
    pi = torch.softmax(theta, dim=-1)
    entropy = -(pi * pi.log()).sum()
    got = _expected_over_generator(theta, "approx_entropy_sum", old=_PI_OLD)
    torch.testing.assert_close(got, entropy, rtol=1e-12, atol=0.0)
    # negative control: weighting by π/π_old instead (what a π_gen = π_old shortcut computes) is off here
    wrong = (_PI_GEN * (pi / _PI_OLD) * -pi.log()).sum()
    assert abs(wrong - entropy) > 0.05
