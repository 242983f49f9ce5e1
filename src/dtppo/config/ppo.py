"""The PPO loop: step counts and batch shape, the advantage estimator and GAE, validation, and DAPO's sample
selection (dynamic sampling, overlong shaping and filtering)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from dtppo.config.rules import at_least, require


@dataclass(frozen=True, kw_only=True)
class DynamicSamplingConfig:
    """Dynamic sampling (DAPO): a step trains on ``ppo.num_prompts_per_step`` prompt groups that carry a learning
    signal, generating more batches of prompts until it has them (verl's ``algorithm.filter_groups``, NeMo-RL's
    ``ppo.use_dynamic_sampling``)."""

    enabled: bool = False
    """Filter groups and refill the batch; false = every group trains."""
    criterion: Literal["reward_std", "value_error"] = "reward_std"
    """Which groups train. ``reward_std``: those whose samples' rewards differ (the peers' criterion, GRPO's
    signal: an all-equal group has zero advantages). ``value_error`` (needs a critic): those with a sample whose
    return differs from the critic's V(s_0) of its prompt by more than ``min_value_error``: with GAE an all-equal
    group still has advantages R − V, and a group the critic already predicts has none; it also works with one
    sample per prompt, where ``reward_std`` would drop every group."""
    min_value_error: float = 0.1
    """``value_error``: the smallest |R − V(s_0)|, in reward units, that keeps a group."""
    max_gen_batches: int = 10
    """Batches of ``ppo.num_prompts_per_step`` prompts a step may generate; when they hold too few groups to
    keep, the run stops with an error naming the criterion (NeMo-RL's ``dynamic_sampling_max_gen_batches``)."""

    def __post_init__(self) -> None:
        at_least(self, 1, "max_gen_batches")
        require(self.min_value_error >= 0.0, "min_value_error", f"must be >= 0, got {self.min_value_error}")


@dataclass(frozen=True, kw_only=True)
class OverlongShapingConfig:
    """DAPO's soft overlong punishment: a response longer than ``max_new_tokens − buffer`` tokens gets
    ``min(−(L − (max_new_tokens − buffer)) / buffer · factor, 0)`` added to its reward (verl's
    ``overlong_buffer_cfg``, OpenRLHF's ``--reward.overlong_buffer_len``)."""

    buffer: int = 0
    """The buffer's length in tokens; 0 = off."""
    factor: float = 1.0
    """The penalty at ``max_new_tokens`` (it grows linearly across the buffer)."""

    @property
    def enabled(self) -> bool:
        return self.buffer > 0

    def __post_init__(self) -> None:
        require(self.buffer >= 0, "buffer", f"must be >= 0 (0 = off), got {self.buffer}")
        require(0.0 <= self.factor < math.inf, "factor", f"must be finite and >= 0, got {self.factor}")


@dataclass(frozen=True, kw_only=True)
class GAEConfig:
    """Generalized advantage estimation (Schulman et al. 2016) over the critic's V(s_t), with separate λ for the
    critic's targets and the policy's advantages (VC-PPO, VAPO)."""

    gamma: float = 1.0
    """Discount γ."""
    lambda_value: float = 1.0
    """λ for the value targets (returns)."""
    lambda_policy: float = 1.0
    """λ for the advantages."""
    length_adaptive_alpha: float = 0.0
    """> 0: per-sample λ_policy = 1 - 1/(α·len) (VAPO)."""
    unit: Literal["token", "turn"] = "token"
    """Multi-turn episodes: ``token`` runs GAE over the policy's tokens (γ and λ per token, across observations);
    ``turn`` takes one GAE step per assistant turn (AReaL's ``gae_timestep_unit: turn``): the value at the turn's
    first token, the turn's rewards, its advantage and return on each of its tokens. Single-turn: the same."""

    def __post_init__(self) -> None:
        for name in ("gamma", "lambda_value", "lambda_policy"):
            require(0.0 <= getattr(self, name) <= 1.0, name, f"must be in [0, 1], got {getattr(self, name)}")
        require(self.length_adaptive_alpha >= 0.0, "length_adaptive_alpha", "must be >= 0")


@dataclass(frozen=True, kw_only=True)
class ValidationConfig:
    """Scoring the policy on the validation problems during a run."""

    period: int = 10
    """Validate every N steps (and at the last step)."""
    at_start: bool = True
    """Validate before the first step; false: the results table ``dtppo ppo`` prints has no start row and no PPO gain
    (nothing was measured at step 0)."""
    max_samples: int = 256
    """Validation problems scored."""
    batch_size: int = 256
    """Validation prompts decoded at once."""
    greedy: bool = True
    """Decode greedily (false: sample as rollouts do, at ``policy.generation.temperature``)."""

    def __post_init__(self) -> None:
        at_least(self, 1, "period", "max_samples", "batch_size")


@dataclass(frozen=True, kw_only=True)
class PPOConfig:
    """The PPO loop: step counts, batch shape, the advantage estimator, validation, sample selection."""

    seed: int = 0
    """Seeds models, sampling and the prompt order."""
    max_num_steps: int = 50
    """PPO steps (rollout + updates) of the run."""
    num_prompts_per_step: int = 64
    """Prompts drawn per step."""
    num_generations_per_prompt: int = 1
    """Responses sampled per prompt."""
    ppo_epochs: int = 1
    """Passes over each step's samples; each pass = critic update, then policy update."""
    advantage_estimator: Literal["gae", "grpo"] = "gae"
    """``gae``: GAE over the critic's V(s_t) (``ppo.gae``). ``grpo``: critic-free, each sample's outcome reward
    normalised within its prompt's group of ``num_generations_per_prompt`` samples (needs >= 2); no value model is
    built, trained, checkpointed or logged (the ``value`` section is not used: its fields are range-checked, its
    batches and layout are not checked against the ranks), and ``normalize_advantages`` does not apply (GRPO has no
    step whitening)."""
    gae: GAEConfig = field(default_factory=GAEConfig)
    """GAE's discount and λs."""
    normalize_advantages: bool = True
    """Whiten advantages over all valid tokens of the step."""
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    """When and how the policy is validated."""
    init_from_sft: bool = False
    """Start policy and critic from ``sft.output_dir`` (running SFT first if missing)."""
    max_consecutive_nonfinite_steps: int = 3
    """Optimizer steps with a NaN/inf loss or gradient are skipped; this many in a row (per model) stop the
    run (exit 3). 0 = never stop."""
    max_lag: int = 0
    """Asynchronous PPO: the batch of step i is generated with the policy of step i − max_lag (of step 0 for the
    first steps), by the generation ranks (``cluster.generation_ranks``) while the trainer trains on earlier
    batches. 0: synchronous, each batch from the policy just updated (NeMo-RL's ``max_trajectory_age_steps``)."""
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    """Train on prompt groups that carry a signal, generating more batches to fill the step (DAPO)."""
    overlong_shaping: OverlongShapingConfig = field(default_factory=OverlongShapingConfig)
    """A reward penalty for responses that run into the last ``buffer`` tokens of ``max_new_tokens`` (DAPO)."""
    overlong_filtering: bool = False
    """Truncated responses (no stop token within the limit) leave the advantages' normalisation and both losses,
    as a mismatched sample does (NeMo-RL's ``ppo.overlong_filtering``); they are still logged."""

    def __post_init__(self) -> None:
        at_least(self, 1, "max_num_steps", "num_prompts_per_step", "num_generations_per_prompt", "ppo_epochs")
        require(self.max_lag >= 0, "max_lag", f"must be >= 0 (0 = synchronous), got {self.max_lag}")
        require(
            self.max_consecutive_nonfinite_steps >= 0,
            "max_consecutive_nonfinite_steps",
            "must be >= 0 (0 = never stop, only skip)",
        )
