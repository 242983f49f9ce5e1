"""KL estimators between the policy and a reference (Schulman, "Approximating KL divergence", 2020).

All take per-token log-probs ``logprobs, ref_logprobs: [B, T]`` and return ``[B, T]``. ``logr`` is clamped to
±20 and the output to ±10 so one extreme token cannot blow up a step.
"""

from __future__ import annotations

import torch

_MAX_LOG_RATIO = 20.0
_MAX_KL = 10.0


def _log_ratio(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return (ref_logprobs - logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)


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


def kl_estimate(name: str, logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Dispatch on the configured estimator name ("k1" | "k2" | "k3")."""
    if name == "k1":
        return kl_k1(logprobs, ref_logprobs)
    if name == "k2":
        return kl_k2(logprobs, ref_logprobs)
    if name == "k3":
        return kl_k3(logprobs, ref_logprobs)
    raise ValueError(f"unknown KL estimator {name!r}")
