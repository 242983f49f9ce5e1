"""Correcting the rollout–training mismatch: the tokens were drawn from π_gen (the generator's numerics, e.g. bf16
vLLM), while PPO's ratio is taken against π_old (the trainer's recompute of the same weights).

Two corrections, each a pure function of the recorded ``gen_logprobs`` and the recomputed ``old_logprobs``:

- Truncated importance sampling (TIS; Yao et al. 2025, "Your efficient RL framework secretly brings you
  off-policy RL training"; verl ``rollout_correction.rollout_is``, NeMo-RL ``tis``): the policy loss of each
  token is weighted by ``min(π_old/π_gen, C)``, a constant (no gradient). ``token``: the token's own ratio;
  ``sequence``: the product of the sequence's ratios (verl's sequence level), the same weight on every token.
- Sequence masking by mismatch (NeMo-RL's ``seq_logprob_error_threshold``): a sequence whose multiplicative
  probability error ``mean_t exp(|log π_gen − log π_old|)`` exceeds a threshold is left out of training.

Shapes: ``B`` samples, ``T`` positions; masks are ``[B, T]`` with 1 on the response tokens that train.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from dtppo.ops import masked_max, masked_mean, masked_min

RolloutIS = Literal["token", "sequence"]


def seq_mult_prob_error(gen_logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per sequence, the mean over its response tokens of ``exp(|log π_gen − log π_old|)``; 1 = no mismatch.

    gen_logprobs, old_logprobs, mask: [B, T] -> [B] float32 (1 for a row without response tokens).
    """
    valid = mask.bool()
    per_token = torch.where(valid, torch.exp((gen_logprobs - old_logprobs).abs()), torch.zeros_like(gen_logprobs))
    count = valid.sum(-1)
    return torch.where(count > 0, per_token.sum(-1) / count.clamp(min=1), torch.ones_like(per_token[:, 0]))


def mismatch_sample_mask(seq_error: torch.Tensor, threshold: float) -> torch.Tensor:
    """1 for a sequence whose ``seq_mult_prob_error`` is at most ``threshold``, else 0.

    seq_error: [B] -> [B] float32."""
    return (seq_error <= threshold).float()


def rollout_is_weights(
    old_logprobs: torch.Tensor, gen_logprobs: torch.Tensor, mask: torch.Tensor, level: RolloutIS, cap: float
) -> torch.Tensor:
    """Truncated importance weights ``min(π_old/π_gen, cap)`` for the policy loss, detached; 0 off the mask.

    old_logprobs, gen_logprobs, mask: [B, T] -> [B, T] float32. ``token``: per token. ``sequence``: per sequence,
    ``min(Π_t π_old/π_gen, cap)`` over its masked tokens (summed in log space, so a long sequence cannot overflow),
    on every token of the sequence.
    """
    log_ratio = torch.where(mask.bool(), (old_logprobs - gen_logprobs).detach(), torch.zeros_like(old_logprobs))
    if level == "sequence":
        log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
    weights = torch.exp(log_ratio.clamp(max=math.log(cap)))
    return torch.where(mask.bool(), weights, torch.zeros_like(weights))


def rollout_is_stats(weights: torch.Tensor, mask: torch.Tensor, cap: float) -> dict[str, torch.Tensor]:
    """``train/rollout_is/*`` over the training tokens: the weights' mean, min and max, and the share of tokens
    whose weight the cap truncated. weights, mask: [B, T] -> 0-d tensors."""
    return {
        "mean": masked_mean(weights, mask),
        "min": masked_min(weights, mask),
        "max": masked_max(weights, mask),
        # The cap comes back as exp(log(cap)) in float32: compare with a relative tolerance.
        "capped_frac": masked_mean((weights >= cap * (1 - 1e-6)).float(), mask),
    }
