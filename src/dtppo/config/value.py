"""The critic's section: its backbone and head, layout, optimizer and batches, its warmup and its targets'
correction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from dtppo.config.loss import LossAggregation
from dtppo.config.models import LoraConfig, ModelConfig, ParallelConfig
from dtppo.config.optim import OptimizerConfig, SchedulerConfig
from dtppo.config.rules import at_least, require


@dataclass(frozen=True, kw_only=True)
class WarmupConfig:
    """Critic-only steps at the start of a run: the policy does not train until the critic has had ``steps`` steps,
    or, with ``until_ev``, until the critic explains the returns (VAPO's and SAO's value pretraining)."""

    steps: int = 0
    """The policy is not updated before this many steps (a fixed warmup; unused when ``until_ev`` is set)."""
    until_ev: float | None = None
    """Critic-only steps until the critic has learned: the policy first trains at the step where the mean of the
    critic's explained variance on fresh rollouts (``train/critic/explained_var``, before its update) over the last
    ``ev_window`` steps reaches this, or at ``max_steps``, whichever comes first; null = the fixed warmup of
    ``steps``. Steps whose returns are all equal (EV undefined) do not count."""
    ev_window: int = 3
    """Steps the explained variance of ``until_ev`` is averaged over."""
    max_steps: int = 20
    """The cap of ``until_ev``: the policy trains from this step on whatever the critic's EV."""

    def __post_init__(self) -> None:
        require(self.steps >= 0, "steps", f"must be >= 0, got {self.steps}")
        at_least(self, 1, "ev_window")
        require(self.max_steps >= 0, "max_steps", f"must be >= 0, got {self.max_steps}")
        require(
            self.until_ev is None or -math.inf < self.until_ev <= 1.0,
            "until_ev",
            f"must be <= 1 (explained variance is at most 1) or null, got {self.until_ev}",
        )


@dataclass(frozen=True, kw_only=True)
class VtraceConfig:
    """The truncation levels of V-trace (Espeholt et al. 2018), used when ``value.target_correction=vtrace``."""

    rho_cap: float = 1.0
    """ρ̄: each token's TD error is weighted by min(ρ̄, π_old/π_gen)."""
    c_cap: float = 1.0
    """c̄: the trace carried past each token is λ·min(c̄, π_old/π_gen)."""

    def __post_init__(self) -> None:
        for name in ("rho_cap", "c_cap"):
            value = getattr(self, name)
            require(0.0 < value < math.inf, name, f"must be finite and > 0, got {value}")


@dataclass(frozen=True, kw_only=True)
class ValueConfig:
    """The critic: a backbone with a scalar head, its layout, optimizer, schedule and batch sizes."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The critic's backbone; path null = the policy's starting weights, or a tiny random model."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """The critic pool's layout."""
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=1e-3))
    """The critic's AdamW."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """The critic's learning-rate schedule."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Adapters on the critic's backbone instead of full fine-tuning; the value head always trains whole."""
    train_global_batch_size: int = 32
    """As ``policy.train_global_batch_size``."""
    train_micro_batch_size: int = 32
    """As ``policy.train_micro_batch_size``."""
    max_tokens_per_microbatch: int | None = None
    """As ``policy.max_tokens_per_microbatch``, for the critic's update."""
    inference_batch_size: int = 64
    """Most samples per no-grad forward on one rank when computing values."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global L2 norm."""
    head_init_std: float = 0.02
    """Scalar head ~ N(0, std), drawn from its own generator seeded by ``ppo.seed``."""
    shift_values: bool = True
    """V(s_t) = head(h[t-1]). false only for the value-alignment experiment (a warning says so)."""
    sequence_packing: bool = True
    """As ``policy.sequence_packing``; V(s_t) is shifted within each packed sequence."""
    activation_checkpointing: bool = False
    """As ``policy.activation_checkpointing``, for the critic's backbone."""
    cpu_offload: bool = False
    """As ``policy.cpu_offload``, for the critic's parameters, gradients and AdamW state."""
    target_correction: Literal["none", "vtrace"] = "none"
    """``none``: GAE on the sampled tokens, whatever policy sampled them. ``vtrace``: the critic's targets (and the
    policy's advantages) are V-trace's (Espeholt et al. 2018), corrected per token by π_old/π_gen, the ratio of the
    policy being trained to the one that generated the tokens (``ppo.max_lag`` steps older; docs/guides/async.md)."""
    vtrace: VtraceConfig = field(default_factory=VtraceConfig)
    """V-trace's truncation levels."""
    loss_aggregation: LossAggregation | None = None
    """How the critic's per-token losses make a minibatch's loss (``loss.aggregation``'s modes); null = the
    policy's ``loss.aggregation`` (verl's critic inherits the actor's), filled in when the Config is built."""
    updates_per_step: int = 1
    """K: passes of the critic's update over each step's batch per policy update (per ``ppo.ppo_epochs`` epoch):
    the critic makes K times the optimizer steps of one pass (SAO's K = 2)."""
    warm_start: str | None = None
    """A critic to start from instead of a fresh one: a dtppo checkpoint (a ``step_N`` directory or the directory
    holding them) or an exported critic (``dtppo export``'s ``critic``). Weights only: the optimizer and the
    schedule start fresh. Its architecture and vocabulary must be this critic's (NeMo-RL's
    ``warm_start_value_checkpoint``). A run that resumes from its own checkpoint ignores it."""
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    """Critic-only steps before the policy trains."""

    def __post_init__(self) -> None:
        at_least(
            self, 1, "train_global_batch_size", "train_micro_batch_size", "inference_batch_size", "updates_per_step"
        )
        budget = self.max_tokens_per_microbatch
        require(budget is None or budget >= 1, "max_tokens_per_microbatch", f"must be >= 1 or null, got {budget}")
        require(self.max_grad_norm > 0.0, "max_grad_norm", "must be > 0")
        require(0.0 <= self.head_init_std < math.inf, "head_init_std", "must be finite and >= 0")
