"""Clipped PPO policy loss and clipped value loss.

Each returns ``(loss, stats)``: the per-token losses summed with the aggregation's weights
(:func:`~dtppo.algorithms.aggregation.loss_token_weights`, computed over the whole minibatch), so a microbatch's loss
is its share of the minibatch's and the shares add up to it whatever the microbatching; a plain sum over ``mask``
without weights. Stats are detached tensors named ``*_sum`` (add across microbatches, then divide by the token count),
``*_min`` or ``*_max`` (reduce with min / max); see :func:`dtppo.observability.metrics.reduce_stats`.
"""

from __future__ import annotations

import torch

from dtppo.algorithms.kl import MAX_LOG_RATIO, kl_loss_surrogate
from dtppo.ops import masked_max, masked_min, masked_sum, weighted_sum


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_c: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    *,
    gen_logprobs: torch.Tensor,
    is_weights: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip (Schulman et al. 2017, eq. 7) with asymmetric clip and dual clip (Ye et al. 2020).

    logprobs: [B, T] current log π (with grad); old_logprobs: [B, T] log π_old; advantages: [B, T];
    mask: [B, T] response tokens; ref_logprobs: [B, T] or None for the optional in-loss KL;
    gen_logprobs: [B, T] log π_gen recorded by the generator that drew the tokens; is_weights: [B, T] constant
    rollout importance weights (:func:`~dtppo.algorithms.mismatch.rollout_is_weights`) or None; weights: [B, T]
    the aggregation's weight of each token's loss (0 off ``mask``), or None for a plain sum over ``mask``.
    Per token: ``L = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high))``; for A < 0 and c > 1: ``min(L, −c·A)``; times
    the token's weight when given (the statistics stay unweighted).
    The in-loss KL is :func:`~dtppo.algorithms.kl.kl_loss_surrogate` (expected gradient ∇KL(π‖π_ref)).
    ``approx_entropy`` estimates H(π) from samples of π_gen: E_gen[−(π/π_gen)·log π] = H(π).
    """
    # Clamped before exp, as the KL's log-ratio (algorithms.kl): a ratio of e^20 is far outside any clip band, while
    # exp overflows float32 past ~88 and one stale or broken log-prob would turn the step's loss into inf or NaN.
    ratio = torch.exp((logprobs - old_logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    ratio_clamped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio_clamped
    per_token = torch.maximum(loss_unclipped, loss_clipped)
    if clip_c is not None:
        per_token = torch.where(advantages < 0, torch.minimum(per_token, -clip_c * advantages), per_token)
    weights = mask if weights is None else weights
    loss = weighted_sum(per_token if is_weights is None else per_token * is_weights, weights)
    stats = {
        "probs_ratio_sum": masked_sum(ratio, mask),
        "probs_ratio_clamped_sum": masked_sum(ratio_clamped, mask),
        "probs_ratio_clamped_min": masked_min(ratio_clamped, mask),
        "probs_ratio_clamped_max": masked_max(ratio_clamped, mask),
        "clipfrac_sum": masked_sum((loss_clipped > loss_unclipped).float(), mask),
        "approx_entropy_sum": masked_sum(
            -torch.exp((logprobs - gen_logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)) * logprobs, mask
        ),
    }
    if ref_logprobs is not None and kl_coef > 0.0:
        # Logged once per step from the rollout (train/kl_penalty), not per microbatch here.
        kl = kl_loss_surrogate(kl_estimator, logprobs, gen_logprobs, ref_logprobs)
        loss = loss + kl_coef * weighted_sum(kl, weights)
    return loss, {k: v.detach() for k, v in stats.items()}


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None,
    scale: float = 1.0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss: ``0.5·scale·max((V − R)², (V_clip − R)²)``, ``V_clip = V_old + clip(V − V_old, ±ε)``.

    values: [B, T] current V(s_t) (already shifted, with grad); old_values: [B, T]; returns: [B, T];
    mask: [B, T] response tokens; weights: [B, T] as :func:`policy_loss`'s. Without ``clip`` the loss is
    ``0.5·scale·(V − R)²``.
    """
    err = (values - returns) ** 2
    if clip is None:
        per_token = err
        clipped = torch.zeros_like(err)
    else:
        values_clipped = old_values + (values - old_values).clamp(-clip, clip)
        err_clipped = (values_clipped - returns) ** 2
        per_token = torch.maximum(err, err_clipped)
        # Only a real clip counts: inside the range V_clip equals V up to round-off, which must not vote.
        clipped = (((values - old_values).abs() > clip) & (err_clipped > err)).float()
    loss = 0.5 * scale * weighted_sum(per_token, mask if weights is None else weights)
    return loss, {"vf_clipfrac_sum": masked_sum(clipped, mask).detach()}


# Var(R) is clamped here: a batch whose returns are all equal has no variance to explain.
EV_MIN_RETURNS_VAR = 1e-8


def explained_var_from_moments(
    mean_r: torch.Tensor, mean_r2: torch.Tensor, mean_res: torch.Tensor, mean_res2: torch.Tensor
) -> torch.Tensor:
    """``EV = 1 − Var(R − V) / max(Var(R), 1e-8)`` from first and second moments of R and R − V."""
    var_r = mean_r2 - mean_r**2
    var_res = mean_res2 - mean_res**2
    return 1.0 - var_res / var_r.clamp(min=EV_MIN_RETURNS_VAR)


def explained_var(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Explained variance over all valid tokens of the batch. returns, values, mask: [B, T]."""
    n = mask.sum().clamp(min=1)
    residual = returns - values
    return explained_var_from_moments(
        masked_sum(returns, mask) / n,
        masked_sum(returns**2, mask) / n,
        masked_sum(residual, mask) / n,
        masked_sum(residual**2, mask) / n,
    )
