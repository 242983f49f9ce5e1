"""AdamW and its learning-rate schedule, one of each per trained model."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from dtppo.config.rules import require


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """AdamW."""

    lr: float = 1e-4
    """Peak learning rate (the schedule multiplies it)."""
    weight_decay: float = 0.01
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.95)
    """Adam's (β1, β2)."""
    eps: float = 1e-8
    """Adam's ε."""

    def __post_init__(self) -> None:
        require(0.0 < self.lr < math.inf, "lr", f"must be finite and > 0, got {self.lr}")
        require(self.weight_decay >= 0.0, "weight_decay", "must be >= 0")
        require(all(0.0 <= b < 1.0 for b in self.betas), "betas", "each must be in [0, 1)")
        require(self.eps > 0.0, "eps", "must be > 0")


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Learning-rate schedule over optimizer steps: linear warmup, then constant or cosine decay."""

    kind: Literal["constant", "cosine"] = "constant"
    """constant | cosine (to ``min_lr_ratio`` over ``total_steps`` optimizer steps)."""
    warmup_steps: int = 0
    """Optimizer steps of linear warmup from lr/warmup_steps to lr."""
    min_lr_ratio: float = 0.1
    """Cosine: the final learning rate as a fraction of the peak."""
    total_steps: int | None = None
    """Optimizer steps the cosine spans; null = the stage's length, derived once when the Config is built
    (sft: ``sft.num_steps``; policy and value: the optimizer steps of the whole PPO run)."""

    def __post_init__(self) -> None:
        require(self.warmup_steps >= 0, "warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        require(
            self.total_steps is None or self.total_steps >= 0, "total_steps", f"must be >= 0, got {self.total_steps}"
        )
        require(0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
