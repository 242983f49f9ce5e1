"""The sections that say where a run writes and where it runs: metrics and trackers, checkpoints, ranks.
Each checks its own fields (``__post_init__``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dtppo.config.rules import at_least, names_a_directory, require


@dataclass(frozen=True, kw_only=True)
class WandbConfig:
    """Weights & Biases logging of the PPO run's metrics."""

    enabled: bool = False
    """Send the PPO run's metrics.jsonl records (same names and steps) to Weights & Biases from rank 0; needs
    ``pip install 'dtppo[wandb]'``. A resumed run continues the W&B run whose id the checkpoint holds."""
    project: str = "dtppo"
    """The W&B project the run is created in."""
    entity: str | None = None
    """The W&B team or user; null: the account's default entity."""
    run_name: str | None = None
    """The run's display name; null: W&B picks one."""
    mode: Literal["online", "offline"] = "online"
    """online: stream to the W&B server; offline: write the run under ``<log_dir>/wandb`` only (upload it
    later with ``wandb sync``)."""

    def __post_init__(self) -> None:
        require(self.project.strip() != "", "project", "must not be empty")


@dataclass(frozen=True, kw_only=True)
class MlflowConfig:
    """MLflow logging of the PPO run's metrics."""

    enabled: bool = False
    """Send the PPO run's metrics.jsonl records (same names and steps) to MLflow from rank 0; needs
    ``pip install 'dtppo[mlflow]'``. A resumed run continues the MLflow run whose id the checkpoint holds."""
    tracking_uri: str | None = None
    """Where runs are stored: a tracking server (``http://host:5000``), a database (``sqlite:///mlflow.db``,
    needs the full ``mlflow`` package) or a directory (``file:/path``, which MLflow 3 opens only with
    ``MLFLOW_ALLOW_FILE_STORE=true``); null: MLflow's own choice (``MLFLOW_TRACKING_URI``, else its default)."""
    experiment: str = "dtppo"
    """The MLflow experiment the run is created in (created if missing)."""
    run_name: str | None = None
    """The run's name; null: MLflow picks one."""

    def __post_init__(self) -> None:
        require(self.experiment.strip() != "", "experiment", "must not be empty")
        require(self.tracking_uri is None or self.tracking_uri.strip() != "", "tracking_uri", "must not be empty")


@dataclass(frozen=True, kw_only=True)
class LoggerConfig:
    """Metrics output."""

    log_dir: str = "runs/ppo"
    """metrics.jsonl and TensorBoard events."""
    tensorboard: bool = True
    """Write TensorBoard events too."""
    progress: bool = True
    """One console line per step with ETA."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases logging (off by default)."""
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    """MLflow logging (off by default)."""

    def __post_init__(self) -> None:
        names_a_directory(self, "log_dir")


@dataclass(frozen=True, kw_only=True)
class CheckpointingConfig:
    """Periodic checkpoints; a run resumes from the latest complete one."""

    enabled: bool = True
    """Save and resume."""
    checkpoint_dir: str = "runs/ppo/checkpoints"
    """Holds step_N directories."""
    save_period: int = 10
    """Save every N steps (and at the last step)."""
    keep_last: int = 2
    """Older complete checkpoints are deleted."""

    def __post_init__(self) -> None:
        at_least(self, 1, "save_period", "keep_last")
        names_a_directory(self, "checkpoint_dir")


@dataclass(frozen=True, kw_only=True)
class ExportConfig:
    """``dtppo export``: the HF directories written from a checkpoint."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The dtype of the exported policy's and critic's weights, named in their config.json. ``auto``: each model's
    source dtype, the ``dtype`` (or ``torch_dtype``) of the config.json it was loaded from (float32 for a model built
    from ``*.model.tiny``, none named, or another dtype); training runs in float32 either way. Also given to the
    command: ``dtppo export CKPT OUT export.dtype=float32``."""


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """Where the ranks run and how policy and critic share them."""

    num_nodes: int = 1
    """nodes x workers_per_node = ranks; each model's dp = its ranks / (its parallel.tp · parallel.cp)."""
    workers_per_node: int = 1
    """> 1: `dtppo ppo` starts the ranks itself (or run it under torchrun)."""
    backend: Literal["local", "ray"] = "local"
    """local (this machine: spawned ranks / torchrun) | ray (one Ray actor per rank)."""
    ray_address: str | None = None
    """Attach to this Ray cluster (or $RAY_ADDRESS); null = start a private local one."""
    ray_placement: Literal["pack", "spread"] = "pack"
    """pack | spread: placement-group strategy for the rank bundles."""
    ray_temp_dir: str = "/tmp/dtppo-ray"
    """Ray session files of a private local instance (short: Ray's socket paths)."""
    ray_timeout_s: float = 120.0
    """Waiting for resources and actors before giving up."""
    policy_ranks: int = 0
    """0: policy and critic colocated on every training rank. N: policy on ranks [0, N), critic on the other
    training ranks, so the two updates run at the same time on different devices."""
    generation_ranks: int = 0
    """0: the policy's own ranks generate the rollouts (between updates). G: the last G of the launched ranks only
    generate, each with a whole copy of the policy refitted after every update, and the others only train; with
    ``ppo.max_lag`` > 0 generation runs that many steps ahead of training (docs/guides/async.md)."""
    generation_timeout_s: float = 1800.0
    """With generation ranks: how long one side waits for the other (a batch, the next weights) before the run
    stops with an error. A generation rank that dies stops the run at once, whatever this says."""

    def __post_init__(self) -> None:
        at_least(self, 1, "num_nodes", "workers_per_node")
        require(self.ray_timeout_s > 0, "ray_timeout_s", "must be > 0")
        require(self.generation_timeout_s > 0, "generation_timeout_s", "must be > 0")
        require(
            0 <= self.generation_ranks < self.world_size,
            "generation_ranks",
            f"must be >= 0 and leave training at least one of the {self.world_size} ranks, got {self.generation_ranks}",
        )
        require(
            self.colocated or 0 < self.policy_ranks < self.training_ranks,
            "policy_ranks",
            f"must be 0 (colocated) or leave the critic at least one of the {self.training_ranks} training ranks, "
            f"got {self.policy_ranks}",
        )

    @property
    def world_size(self) -> int:
        """Every launched rank: the training ranks, then the generation ranks."""
        return self.num_nodes * self.workers_per_node

    @property
    def training_ranks(self) -> int:
        """The ranks that train (and, without generation ranks, also generate)."""
        return self.world_size - self.generation_ranks

    @property
    def colocated(self) -> bool:
        return self.policy_ranks == 0

    def pool(self, role: Literal["policy", "value"]) -> range:
        """The training ranks that hold ``role``'s model."""
        if self.colocated:
            return range(self.training_ranks)
        return range(self.policy_ranks) if role == "policy" else range(self.policy_ranks, self.training_ranks)
