"""The KL estimators k1, k2, k3 (``dtppo.algorithms.kl``): their formulas and clamps, exact expectations over a small
categorical distribution in float64, the estimator dispatch, and the in-loss surrogate's gradient where a clamp
binds. The in-loss term inside the policy loss: tests/unit/algorithms/test_losses.py."""

import pytest
import torch

from dtppo.algorithms.kl import MAX_LOG_RATIO, kl_estimate, kl_k1, kl_k2, kl_k3, kl_loss_surrogate

_PI = torch.tensor([0.3, 0.1, 0.25, 0.15, 0.2], dtype=torch.float64)
_PI_REF = torch.tensor([0.1, 0.3, 0.2, 0.25, 0.15], dtype=torch.float64)


def test_kl_estimators():
    lp = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.0, -1.0, -2.5])
    logr = ref - lp
    assert torch.allclose(kl_k1(lp, ref), -logr)
    assert torch.allclose(kl_k2(lp, ref), logr**2 / 2)
    assert torch.allclose(kl_k3(lp, ref), logr.exp() - 1 - logr)
    assert kl_k3(torch.tensor([0.0]), torch.tensor([0.0])).item() == 0.0
    # clamps: log-ratio to ±20 and the estimate to ±10
    assert kl_k3(torch.tensor([-100.0]), torch.tensor([0.0])).item() == 10.0
    assert kl_k1(torch.tensor([0.0]), torch.tensor([-100.0])).item() == 10.0
    assert torch.all(kl_k3(torch.randn(100) * 5, torch.randn(100) * 5) >= 0)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_in_loss_kl_gradient_where_clamped_is_zero_and_exact_elsewhere(estimator):
    # log(π_ref/π) = +4: k3 = e^4 − 5 ≈ 49.6 is clamped to 10; before the fix ρ kept its gradient there and
    # d/dlog π was +10 (descent pushed log π further from the reference). Unclamped, per sample with ρ = 1, the
    # gradient is log(π/π_ref) for k2 and k3, and log(π/π_ref) + 1 for k1 (its zero-mean ρ·∇log π term).
    lp = torch.tensor([-6.0, -2.0, -30.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-2.0, -6.0, -2.0], dtype=torch.float64)  # log(π_ref/π) = +4, −4, +28 (log-ratio clamp)
    term = kl_loss_surrogate(estimator, lp, lp.detach(), ref)
    term.sum().backward()
    logr = (ref - lp).detach()
    exact = {"k1": -logr + 1.0, "k2": -logr, "k3": -logr}[estimator]
    clamped = {"k1": [False, False, True], "k2": [False, False, True], "k3": [True, False, True]}[estimator]
    for i, is_clamped in enumerate(clamped):
        expected = 0.0 if is_clamped else float(exact[i])
        assert abs(lp.grad[i].item() - expected) < 1e-9, (estimator, i, lp.grad[i].item(), expected)
    # the clamped value itself is still the estimate (what the loss adds), so logging and the loss are unchanged
    assert torch.allclose(term.detach(), {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}[estimator](lp.detach(), ref))


def test_k1_and_k3_are_unbiased_and_k2_is_not_exactly_over_a_categorical():
    # E_{y~π}[k(y)] summed over the whole support (float64, no sampling): k1 and k3 give KL(π‖π_ref) exactly
    kl = float((_PI * (_PI.log() - _PI_REF.log())).sum())
    lp, ref = _PI.log(), _PI_REF.log()
    assert float((_PI * kl_k1(lp, ref)).sum()) == pytest.approx(kl, rel=1e-12)
    assert float((_PI * kl_k3(lp, ref)).sum()) == pytest.approx(kl, rel=1e-12)
    # k2's expectation is half the second moment of the log-ratio: another number (the test can tell them apart)
    k2 = float((_PI * kl_k2(lp, ref)).sum())
    assert k2 == pytest.approx(float((_PI * 0.5 * (ref - lp) ** 2).sum()), rel=1e-12)
    assert abs(k2 - kl) > 1e-3


def test_the_log_ratio_clamp_binds_at_max_log_ratio():
    far = torch.tensor([-(MAX_LOG_RATIO + 5.0)], dtype=torch.float64)
    # log r = +25 clamps to +20: k2 = 200 -> the output clamp 10; k1 = -20 -> -10
    assert kl_k1(far, torch.zeros(1, dtype=torch.float64)).item() == -10.0
    assert kl_k2(far, torch.zeros(1, dtype=torch.float64)).item() == 10.0
    # inside both clamps k2 is (log r)²/2 exactly
    assert kl_k2(torch.tensor([-3.0]), torch.tensor([-1.0])).item() == 2.0


@pytest.mark.parametrize("name, fn", [("k1", kl_k1), ("k2", kl_k2), ("k3", kl_k3)])
def test_kl_estimate_dispatches_on_the_name(name, fn):
    lp, ref = torch.tensor([[-1.0, -0.2]]), torch.tensor([[-0.4, -2.0]])
    assert torch.equal(kl_estimate(name, lp, ref), fn(lp, ref))


def test_an_unknown_estimator_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_estimate("k4", torch.zeros(1), torch.zeros(1))
