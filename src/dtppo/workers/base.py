"""What the policy and value workers share: rank layout, training engine, lifecycle hooks, checkpoint state."""

from __future__ import annotations

from torch import nn

from dtppo.config import Config, PolicyConfig, ValueConfig
from dtppo.workers.engine import TrainEngine
from dtppo.workers.layout import RankLayout


class Worker:
    """A plain class owning one model on this rank. Every rank builds the workers it holds; a launcher starts
    ranks (local processes or Ray actors), never workers, and ``workers.role`` calls them from the step."""

    cfg: Config
    layout: RankLayout
    model: nn.Module
    engine: TrainEngine

    def _build_engine(self, section: PolicyConfig | ValueConfig) -> TrainEngine:
        name = "policy" if isinstance(section, PolicyConfig) else "value"
        return self.layout.engine(
            self.model,
            section.optimizer,
            section.scheduler,
            section.max_grad_norm,
            name=name,
            max_consecutive_nonfinite=self.cfg.ppo.max_consecutive_nonfinite_steps,
            unsharded_accumulation=section.parallel.unsharded_grad_accumulation,
            aggregation=self.cfg.loss.aggregation if name == "policy" else self.cfg.value.loss_aggregation,
            horizon=self.cfg.loss.aggregation_horizon,
        )

    # ---- lifecycle. These only switch the module mode: weights and optimizer state stay where they are in every
    # phase (on the rank's device; with ``cpu_offload``, in host memory between FSDP2's per-block copies). The
    # policy's vLLM engine has hooks of its own (PolicyWorker).
    def prepare_for_inference(self) -> None:
        """``model.eval()``."""
        self.model.eval()

    def finish_inference(self) -> None:
        """Nothing: inference leaves no state to release."""

    def prepare_for_training(self) -> None:
        """``model.train()``."""
        self.model.train()

    def finish_training(self) -> None:
        """``model.eval()``."""
        self.model.eval()

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped for a non-finite loss or gradient so far."""
        return self.engine.skipped_steps

    # ---- checkpoints: sharded tensors go through torch.distributed.checkpoint, the rest is replicated
    def checkpoint_state(self) -> dict:
        """Model and optimizer state (sharded where the model is)."""
        return self.engine.state_dict()

    def replicated_state(self) -> dict:
        """Schedule position and skipped-step counts: the same on every rank of the pool."""
        return self.engine.extra_state()

    def load_checkpoint(self, sharded: dict, extra: dict) -> None:
        self.engine.load_state_dict(sharded)
        self.engine.load_extra_state(extra)
