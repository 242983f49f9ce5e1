"""What the policy and value workers share: rank layout, updater, lifecycle hooks, checkpoint state."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from dtppo.config import Config, PolicyConfig, ValueConfig
from dtppo.distributed.comm import is_main_rank
from dtppo.distributed.parallelize import compute_dtype
from dtppo.errors import InputError
from dtppo.models.attention import context_parallel_refusal
from dtppo.models.packing import check_packing, packing_tolerance, probe_rows, probe_width
from dtppo.workers.layout import RankLayout
from dtppo.workers.updater import Updater


class Worker:
    """A plain class owning one model on this rank. Every rank builds the workers it holds; a launcher starts
    ranks (local processes or Ray actors), never workers, and ``workers.role`` calls them from the step."""

    cfg: Config
    layout: RankLayout
    model: nn.Module
    updater: Updater

    def _build_updater(self, section: PolicyConfig | ValueConfig) -> Updater:
        name = "policy" if isinstance(section, PolicyConfig) else "value"
        return self.layout.updater(
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

    def _check_context(self, section: str, model_config) -> None:
        """Refuse ``{section}.parallel.cp`` > 1 at start for what its attention kernel does not compute: a model
        ``models.attention.context_parallel_refusal`` names, or a GPU (its kernel has run on CPU only)."""
        if self.layout.shards is None:
            return
        reason = context_parallel_refusal(model_config)
        if reason is None and self.layout.device.type != "cpu":
            reason = "its attention kernel runs on CPU only so far (torch's flash attention for CPU)"
        if reason is not None:
            raise InputError(f"{section}.parallel.cp: context parallelism is not available here: {reason}; set it to 1")

    @torch.no_grad()
    def _check_packing(self, key: str, what: str, model_config, per_token: Callable[..., torch.Tensor]) -> None:
        """Refuse ``key`` (a ``sequence_packing``) at start unless the model gives the same ``what`` through packed
        rows as through padded ones, on a probe batch (``models.packing.check_packing``). Called when packing is on.

        per_token(input_ids, attention_mask, packing) -> [B, T]: the worker's own path, on the wrapped model (every
        rank runs the same probe, so sharded forwards meet their collectives)."""
        longest = self.cfg.data.max_prompt_tokens + self.cfg.response_horizon
        ids, attention_mask = probe_rows(model_config.get_text_config().vocab_size, probe_width(model_config, longest))
        ids, attention_mask = ids.to(self.layout.device), attention_mask.to(self.layout.device)
        training = self.model.training
        self.model.eval()  # LoRA's dropout would make the two passes differ
        try:
            padded, packed = (per_token(ids, attention_mask, packing) for packing in (False, True))
        finally:
            self.model.train(training)
        valid = attention_mask.bool()
        valid[:, 0] = False  # no log-prob, and V(s_0) = 0, at a row's first token
        diff = check_packing(key, model_config, what, padded, packed, valid, packing_tolerance(compute_dtype()))
        if is_main_rank():
            print(f"{key}: packed = padded on a {ids.shape[1]}-token probe (largest difference {diff:.1e})", flush=True)

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
        return self.updater.skipped_steps

    # ---- checkpoints: sharded tensors go through torch.distributed.checkpoint, the rest is replicated
    def checkpoint_state(self) -> dict:
        """Model and optimizer state (sharded where the model is)."""
        return self.updater.state_dict()

    def replicated_state(self) -> dict:
        """Schedule position and skipped-step counts: the same on every rank of the pool."""
        return self.updater.extra_state()

    def load_checkpoint(self, sharded: dict, extra: dict) -> None:
        self.updater.load_state_dict(sharded)
        self.updater.load_extra_state(extra)
