"""ValueWorker: the critic. Computes V(s_t) for rollouts and trains with the clipped value loss."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from dtppo.algorithms.losses import value_loss
from dtppo.config import Config
from dtppo.models.causal_lm import tiny_qwen2_config
from dtppo.models.value import ValueModel, build_backbone
from dtppo.types import Experience
from dtppo.workers.engine import TrainEngine


class ValueWorker:
    """Owns the value model (backbone + scalar head) and its optimizer.

    The global RNG is seeded before any model is built and the head has its own seeded generator, so a fresh
    critic is identical across launches.
    """

    def __init__(self, cfg: Config, tokenizer: PreTrainedTokenizerBase):
        torch.manual_seed(cfg.ppo.seed)
        self.cfg = cfg
        tiny = tiny_qwen2_config(cfg.value.model.tiny, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
        backbone = build_backbone(cfg.value_init_path, tiny, seed=cfg.ppo.seed)
        self.model = ValueModel(backbone, seed=cfg.ppo.seed, init_std=cfg.value.head_init_std,
                                shift=cfg.value.shift_values)
        self.engine = TrainEngine(self.model, cfg.value.optimizer, cfg.value.scheduler, cfg.value.max_grad_norm)

    # ---- lifecycle: on a shared GPU these move weights and optimizer state; on CPU only the mode changes.
    def prepare_for_inference(self) -> None:
        self.model.eval()

    def finish_inference(self) -> None:
        pass

    def prepare_for_training(self) -> None:
        self.model.train()

    def finish_training(self) -> None:
        self.model.eval()

    @torch.no_grad()
    def get_values(self, experience: Experience) -> torch.Tensor:
        """V(s_t) for every position of every row. Returns [B, T] float32 (0 at t=0)."""
        size = self.cfg.value.inference_batch_size
        chunks = [
            self.model.values(experience.input_ids[start : start + size], experience.attention_mask[start : start + size])
            for start in range(0, experience.batch_size, size)
        ]
        return torch.cat(chunks)

    def train(self, experience: Experience) -> dict[str, torch.Tensor]:
        """One epoch of value regression onto ``experience.returns`` (needs old_values and returns)."""
        loss_cfg = self.cfg.loss

        def loss_fn(micro: Experience) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            values = self.model.values(micro.input_ids, micro.attention_mask)
            return value_loss(values, micro.old_values, micro.returns, micro.response_mask,
                              loss_cfg.value_clip, loss_cfg.value_loss_scale)

        return self.engine.train(
            experience, loss_fn, self.cfg.value.train_global_batch_size, self.cfg.value.train_micro_batch_size
        )

    def save_checkpoint(self) -> dict:
        return self.engine.state_dict()

    def load_checkpoint(self, state: dict) -> None:
        self.engine.load_state_dict(state)
