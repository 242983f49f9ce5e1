"""The losses: the clipped policy loss and its aggregation, the value loss, the KL penalty and the correction for
the generator-trainer mismatch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dtppo.config.rules import require

LossAggregation = Literal[
    "token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]


@dataclass(frozen=True, kw_only=True)
class KLConfig:
    """The KL penalty against the reference (the starting policy, or the policy with its adapters off)."""

    coef: float = 0.0
    """β; 0 = no reference model."""
    estimator: Literal["k1", "k2", "k3"] = "k3"
    """k1 | k2 | k3 (Schulman's estimators of KL(π‖π_ref) from samples of π)."""
    in_reward: bool = False
    """true: -β·KL_t in the token rewards; false: β·KL in the policy loss."""

    def __post_init__(self) -> None:
        require(self.coef >= 0.0, "coef", "must be >= 0")


@dataclass(frozen=True, kw_only=True)
class RolloutCorrectionConfig:
    """What the losses do about the mismatch between the generator's log-probs (π_gen) and the trainer's (π_old):
    weight tokens by truncated importance sampling, drop samples past an error threshold (verl's
    ``rollout_correction``)."""

    importance_sampling: Literal["token", "sequence"] | None = None
    """Truncated importance sampling against the generator: each token's policy loss is weighted by
    ``min(π_old/π_gen, importance_sampling_cap)`` (no gradient), the token's ratio (``token``) or its sequence's
    product (``sequence``); null = unweighted (verl's ``rollout_correction.rollout_is``)."""
    importance_sampling_cap: float = 2.0
    """C >= 1 of ``importance_sampling`` (verl's ``rollout_is_threshold``, slime's ``--tis-clip``)."""
    seq_logprob_error_threshold: float | None = None
    """A sample whose multiplicative probability error ``mean_t exp(|log π_gen − log π_old|)`` exceeds this (>= 1)
    is left out of the advantages' normalisation and of both losses (NeMo-RL's key); null = none is (the
    errors are logged either way)."""

    def __post_init__(self) -> None:
        cap = self.importance_sampling_cap
        require(cap >= 1.0, "importance_sampling_cap", f"must be >= 1, got {cap}")
        require(
            self.seq_logprob_error_threshold is None or self.seq_logprob_error_threshold >= 1.0,
            "seq_logprob_error_threshold",
            "must be >= 1 (no error is 1) or null",
        )


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    """The clipped PPO and value losses, the KL penalty and the rollout correction."""

    ratio_clip_low: float = 0.2
    """ε_low: the ratio is clipped below at 1 - ε_low."""
    ratio_clip_high: float = 0.2
    """ε_high: the ratio is clipped above at 1 + ε_high."""
    ratio_clip_c: float | None = None
    """Dual clip c > 1 for A < 0; null = off."""
    kl: KLConfig = field(default_factory=KLConfig)
    """The KL penalty."""
    value_clip: float | None = 0.5
    """ε_v around the old values; null = unclipped."""
    value_loss_scale: float = 1.0
    """Multiplies the critic's loss."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Importance weights and sample masks against the generator-trainer mismatch."""
    aggregation: LossAggregation = "token-mean"
    """How per-token losses make a minibatch's policy loss (verl's ``loss_agg_mode``), over the minibatch's trained
    tokens and sequences whatever the microbatching and data-parallel ranks (docs/guides/recipes.md):
    ``token-mean`` (every token alike; DAPO), ``token-sum`` (no normalisation), ``seq-mean-token-sum`` (each
    sequence's sum, averaged over sequences), ``seq-mean-token-mean`` (each sequence's mean, averaged: GRPO's
    original), ``seq-mean-token-sum-norm`` (sums over sequences × ``aggregation_horizon``: Dr. GRPO)."""
    aggregation_horizon: int | None = None
    """The constant of ``seq-mean-token-sum-norm`` (verl's ``loss_scale_factor``); null = the longest response:
    ``policy.generation.max_new_tokens``, or ``env.max_total_tokens`` for episodes."""

    def __post_init__(self) -> None:
        require(0.0 <= self.ratio_clip_low < 1.0, "ratio_clip_low", "must be in [0, 1)")
        require(self.ratio_clip_high >= 0.0, "ratio_clip_high", "must be >= 0")
        require(self.ratio_clip_c is None or self.ratio_clip_c > 1.0, "ratio_clip_c", "must be > 1 or null")
        require(self.value_clip is None or self.value_clip > 0.0, "value_clip", "must be > 0 or null")
        require(self.value_loss_scale > 0.0, "value_loss_scale", "must be > 0")
        require(
            self.aggregation_horizon is None or self.aggregation_horizon >= 1,
            "aggregation_horizon",
            f"must be >= 1 or null, got {self.aggregation_horizon}",
        )
