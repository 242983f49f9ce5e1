"""ValueWorker: the critic. Computes V(s_t) for rollouts and trains with the clipped value loss."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from dtppo.algorithms.losses import value_loss
from dtppo.checkpoint.warm_start import load_warm_start
from dtppo.config import Config
from dtppo.distributed.comm import is_main_rank
from dtppo.faults import value_grad_scale
from dtppo.models.causal_lm import tiny_qwen2_config
from dtppo.models.loading import disable_dropout
from dtppo.models.lora import add_adapters
from dtppo.models.lora import describe as describe_lora
from dtppo.models.value import ValueModel, build_backbone, reward_model_head
from dtppo.types import Experience
from dtppo.workers.base import Worker
from dtppo.workers.layout import RankLayout


class ValueWorker(Worker):
    """Owns the value model (backbone + scalar head) and its optimizer.

    The global RNG is seeded before any model is built and the head has its own seeded generator, so a fresh
    critic is identical across launches.
    """

    def __init__(self, cfg: Config, tokenizer: PreTrainedTokenizerBase, layout: RankLayout | None = None):
        torch.manual_seed(cfg.ppo.seed)
        self.cfg = cfg
        tiny = tiny_qwen2_config(cfg.value.model.tiny, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
        backbone = disable_dropout(build_backbone(cfg.value_init_path, tiny, seed=cfg.ppo.seed))
        self.layout = layout or RankLayout(cfg.value.parallel)
        # A reward-model directory (value.model.path = reward.model.path, TRL's convention) also gives its head.
        head = reward_model_head(cfg.value_init_path)
        critic = ValueModel(
            backbone,
            seed=cfg.ppo.seed,
            init_std=cfg.value.head_init_std,
            shift=cfg.value.shift_values,
            sequence_packing=cfg.value.sequence_packing,
            head=head,
            shards=self.layout.shards,
        )
        self._check_context("value", backbone.config)
        if cfg.value.warm_start is not None:  # the whole critic, before any adapter: they start fresh on it
            load_warm_start(critic, cfg.value.warm_start)
            if is_main_rank():
                print(f"value: warm start from {cfg.value.warm_start} (weights only)", flush=True)
        if cfg.value.lora.enabled:  # on the backbone only: the head is not an adapted layer and trains whole
            add_adapters(critic.backbone, cfg.value.lora, cfg.ppo.seed)
            if is_main_rank():
                print(f"value: {describe_lora(critic, cfg.value.lora)} (the value head included)", flush=True)
        self.model = self.layout.wrap(critic, cfg.value.activation_checkpointing, cfg.value.cpu_offload)
        self.updater = self._build_updater(cfg.value)
        # After the updater: a forward before the optimizer is built (FSDP2's lazy init then runs earlier) changed
        # the critic's TP = 2 gradients in tests/distributed/test_parity.py.
        if cfg.value.sequence_packing:
            self._check_packing("value.sequence_packing", "values", backbone.config, self.model.values)

    @torch.no_grad()
    def get_values(self, experience: Experience) -> torch.Tensor:
        """V(s_t) for every position of every row. Returns [B, T] float32 (0 at t=0 and on padding).

        Each dp rank scores its block of whole rows and the blocks are gathered, so the shift inside
        ``values()`` always sees complete sequences, never a shard boundary.
        """
        return self.layout.map_rows(
            experience,
            lambda rows: self.model.values(rows.input_ids, rows.attention_mask),
            self.cfg.value.inference_batch_size,
        )

    def loss(self, micro: Experience) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Clipped value loss of one microbatch (its share of the minibatch's aggregated loss, with grad) and its
        statistics."""
        values = self.model.values(micro.input_ids, micro.attention_mask)
        loss, stats = value_loss(
            values,
            micro.old_values,
            micro.returns,
            micro.train_mask,
            self.cfg.loss.value_clip,
            self.cfg.loss.value_loss_scale,
            weights=micro.loss_weights,
        )
        scale = value_grad_scale()
        if scale != 1.0:  # test hook (dtppo.faults): same loss value, gradient scaled by 0 or -1
            loss = scale * loss + (1.0 - scale) * loss.detach()
        return loss, stats

    def train(self, experience: Experience) -> dict[str, torch.Tensor]:
        """One epoch of value regression onto ``experience.returns`` (needs old_values and returns)."""
        section = self.cfg.value
        return self.updater.train(
            experience,
            self.loss,
            section.train_global_batch_size,
            section.train_micro_batch_size,
            section.max_tokens_per_microbatch,
        )
