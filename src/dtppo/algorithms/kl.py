"""KL estimators between the policy and a reference (Schulman, "Approximating KL divergence", 2020).

All take per-token log-probs ``logprobs, ref_logprobs: [B, T]`` and return ``[B, T]``. ``logr`` is clamped to
±20 and the output to ±10 so one extreme token cannot blow up a step. Where either clamp binds, the in-loss
term (:func:`kl_loss_surrogate`) is a constant: no gradient, as in NeMo-RL.

Which KL each option optimises (derivations in docs/design/kl.md). Samples y come from the
generator π_gen; π is the policy being trained and ρ = π/π_gen.

- In the loss (``loss.kl.in_reward=false``): :func:`kl_loss_surrogate`, whose expected gradient is exactly
  ∇KL(π‖π_ref) (per token, given the prefix) for every estimator.
- In the reward (``loss.kl.in_reward=true``): ``−β·k`` is a reward computed once from π_old and ascended
  through the policy gradient. With k1 that is the gradient of the sequence-level KL(π‖π_ref) at π = π_old.
  k2 and k3 as rewards are biased: their score-function gradient is not ∇KL (with k3 it is
  ∇KL(π‖π_ref) − ∇KL(π_ref‖π), which vanishes to second order near π_ref).
"""

from __future__ import annotations

import torch

MAX_LOG_RATIO = 20.0
_MAX_KL = 10.0


def _log_ratio(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return (ref_logprobs - logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = −log r, unbiased, high variance, can be negative."""
    return (-_log_ratio(logprobs, ref_logprobs)).clamp(-_MAX_KL, _MAX_KL)


def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = (log r)² / 2, biased, low variance, non-negative."""
    return (0.5 * _log_ratio(logprobs, ref_logprobs) ** 2).clamp(-_MAX_KL, _MAX_KL)


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 = r − 1 − log r, unbiased, low variance, non-negative."""
    logr = _log_ratio(logprobs, ref_logprobs)
    return (logr.exp() - 1.0 - logr).clamp(-_MAX_KL, _MAX_KL)


def kl_loss_surrogate(
    name: str, logprobs: torch.Tensor, gen_logprobs: torch.Tensor, ref_logprobs: torch.Tensor
) -> torch.Tensor:
    """Per-token in-loss KL term whose expected gradient over samples of π_gen is ∇KL(π‖π_ref).

    logprobs: [B, T] log π (with grad); gen_logprobs: [B, T] log π_gen of the sampled tokens (the
    distribution that drew them); ref_logprobs: [B, T] -> [B, T].
    k1 and k3 are unbiased (E_π[k] = KL(π‖π_ref) for every π), so E_gen[ρ·k] *is* the KL and the whole
    product is differentiated. k2 is biased, but its pathwise gradient E_π[∇k2] = E_π[log(π/π_ref)·∇log π]
    is ∇KL, so its weight ρ is held constant. Per sample, k2 and k3 give the same gradient, ρ·log(π/π_ref)·∇log π;
    k1 adds the zero-mean term ρ·∇log π (more variance). Without ρ (the samples treated as drawn from π),
    k1's gradient is 0 in expectation and k3 descends KL(π_ref‖π) instead.

    Where the estimate is clamped (``|k| = 10`` or ``|log r| = 20``) the term's value is kept but its gradient is
    zero: the clamped k is constant while ρ still carries ∇log π, which alone points the wrong way (with k3 at
    log(π_ref/π) = 4 it gives +10 per token where ∇KL gives −4), on the tokens farthest from the reference.
    """
    # ρ is clamped like the estimators' own log-ratio, so a token the generator found unlikely cannot blow up.
    rho = torch.exp((logprobs - gen_logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    estimate = kl_estimate(name, logprobs, ref_logprobs)
    term = (rho.detach() if name == "k2" else rho) * estimate
    logr = (ref_logprobs - logprobs).detach()
    clamped = (estimate.detach().abs() >= _MAX_KL) | (logr.abs() >= MAX_LOG_RATIO)
    return torch.where(clamped, term.detach(), term)


def kl_estimate(name: str, logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Dispatch on the configured estimator name ("k1" | "k2" | "k3")."""
    if name == "k1":
        return kl_k1(logprobs, ref_logprobs)
    if name == "k2":
        return kl_k2(logprobs, ref_logprobs)
    if name == "k3":
        return kl_k3(logprobs, ref_logprobs)
    raise ValueError(f"unknown KL estimator {name!r}")
