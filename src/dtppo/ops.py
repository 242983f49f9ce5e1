"""Masked reductions and log-probability helpers: the one place these are written.

Shapes: ``B`` batch, ``T`` sequence, ``V`` vocabulary. Masks are float or bool ``[B, T]`` with 1 on valid
positions. Every reduction ignores masked positions entirely, so a NaN or poison value there cannot leak.
"""

from __future__ import annotations

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over valid positions. x, mask: [B, T]. Returns a 0-d tensor."""
    return torch.where(mask.bool(), x, torch.zeros_like(x)).sum()


def weighted_sum(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Sum of ``x · weights`` over positions whose weight is not 0 (a 0/1 mask gives :func:`masked_sum`).
    x, weights: [B, T]. Returns a 0-d tensor."""
    return torch.where(weights != 0, x * weights, torch.zeros_like(x)).sum()


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over valid positions (0 when none). x, mask: [B, T]."""
    return masked_sum(x, mask) / mask.sum().clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over valid positions. x, mask: [B, T]."""
    n = mask.sum()
    centred = x - masked_mean(x, mask)
    var = masked_sum(centred * centred, mask) / n.clamp(min=1)
    if unbiased:
        var = var * n / (n - 1).clamp(min=1)
    return var


def masked_min(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Min over valid positions; +inf when there are none. x, mask: [B, T]."""
    return torch.where(mask.bool(), x, torch.full_like(x, float("inf"))).min()


def masked_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Max over valid positions; -inf when there are none. x, mask: [B, T]."""
    return torch.where(mask.bool(), x, torch.full_like(x, float("-inf"))).max()


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x − mean)·rsqrt(var + eps)`` over valid positions (unbiased var); masked positions 0. x, mask: [B, T].

    eps goes under the root, as in verl and NeMo-RL: when every x is equal, the float32 mean can be an ulp
    off, and ``/(std + eps)`` would blow that round-off up to O(1) per token; ``rsqrt(var + eps)`` caps the
    scale at 1/sqrt(eps), so a batch with no signal stays ≈ 0.
    """
    mean = masked_mean(x, mask)
    whitened = (x - mean) * torch.rsqrt(masked_var(x, mask, unbiased=True) + eps)
    return torch.where(mask.bool(), whitened, torch.zeros_like(whitened))


def shift_right(x: torch.Tensor, sequence_starts: torch.Tensor | None = None) -> torch.Tensor:
    """``out[:, t] = x[:, t-1]``, ``out[:, 0] = 0``. x: [B, T] or [B, T, ...].

    The single shift helper: it turns "output at position t-1" into "quantity about token t", which is how
    both logprobs (logits at t-1 predict token t) and values (V(s_t) is read at t-1) are aligned.
    sequence_starts: [B, T] bool, True at the first token of each sequence of a packed row (several
    sequences back to back). Those positions get 0 too, so nothing is shifted across a sequence boundary.
    """
    out = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)
    if sequence_starts is None:
        return out
    starts = sequence_starts.reshape(*sequence_starts.shape, *([1] * (x.dim() - 2)))
    return torch.where(starts, torch.zeros_like(out), out)


def logprobs_from_logits(
    logits: torch.Tensor, input_ids: torch.Tensor, sequence_starts: torch.Tensor | None = None
) -> torch.Tensor:
    """``out[b, t] = log p(input_ids[b, t] | input_ids[b, :t])``; index 0 holds 0.

    logits: [B, T, V] (position t-1 predicts token t), input_ids: [B, T] -> [B, T] float32.
    sequence_starts: [B, T] bool for packed rows (see :func:`shift_right`); each sequence's first token
    holds 0, because the logits before it belong to the previous sequence.
    """
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    # Position t-1's prediction of token t, moved to t by the shift helper (which also zeroes t = 0).
    return shift_right(torch.cat([picked, torch.zeros_like(picked[:, :1])], dim=1), sequence_starts)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the predictive distribution at each position. logits: [B, T, V] -> [B, T]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)
