"""What both workers share: optimizer and schedule, and the minibatch / microbatch update loop.

Normalisation (SPEC §3): each minibatch is one optimizer step; its loss is the sum of per-token losses
divided by the minibatch's valid-token count, counted once before the microbatch loop. Any microbatch size
or accumulation count therefore gives the same gradient.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from dtppo.config import OptimizerConfig, SchedulerConfig
from dtppo.distributed.comm import all_reduce
from dtppo.distributed.grad_norm import clip_grad_norm_
from dtppo.metrics import normalise, reduce_across_ranks, reduce_stats
from dtppo.types import Experience

LossFn = Callable[[Experience], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def lr_lambda(cfg: SchedulerConfig) -> Callable[[int], float]:
    """Linear warmup, then constant or cosine decay to ``min_lr_ratio`` over ``total_steps``."""

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.kind == "constant" or cfg.total_steps <= cfg.warmup_steps:
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / (cfg.total_steps - cfg.warmup_steps))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


class TrainEngine:
    """AdamW + LambdaLR over ``model``'s parameters, with grad-norm clipping and non-finite step skipping.

    Data parallel: ``dp_rank``/``dp_size`` pick this rank's rows of each minibatch, ``dp_group`` reduces
    metrics. The model is expected to sum (not average) gradients across those ranks (see parallelize()).
    """

    def __init__(self, model: nn.Module, optim: OptimizerConfig, schedule: SchedulerConfig, max_grad_norm: float,
                 dp_rank: int = 0, dp_size: int = 1, dp_group=None):
        self.model = model
        self.max_grad_norm = max_grad_norm
        self.dp_rank, self.dp_size, self.dp_group = dp_rank, dp_size, dp_group
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=optim.lr, betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay,
            foreach=None if dp_group is None else False,  # params may live on different meshes
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(schedule))
        self.skipped_steps = 0

    def optimizer_step(self) -> torch.Tensor:
        """Clip, then step unless the gradient norm is non-finite (counted in ``skipped_steps``)."""
        grad_norm = clip_grad_norm_(list(self.model.parameters()), self.max_grad_norm)
        finite = torch.isfinite(grad_norm)
        if bool(finite):
            self.optimizer.step()
        else:
            self.skipped_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return grad_norm.detach()

    def train(self, experience: Experience, loss_fn: LossFn, global_batch: int, micro_batch: int) -> dict[str, torch.Tensor]:
        """One pass over ``experience`` in minibatches of ``global_batch`` samples (one optimizer step each).

        Returns tensors: ``loss`` and ``grad_norm`` (means over optimizer steps), ``lr``, and the
        loss function's statistics reduced over all microbatches (sums normalised by all valid tokens).
        """
        self.model.train()
        losses, norms, stats = [], [], []
        for start in range(0, experience.batch_size, global_batch):
            minibatch = experience.slice(start, start + global_batch)
            # Every rank holds the whole step's batch, so the global token count needs no collective.
            num_tokens = minibatch.response_mask.sum().clamp(min=1)
            local = minibatch.shard(self.dp_rank, self.dp_size)
            loss_total = torch.zeros(())
            for micro_start in range(0, local.batch_size, micro_batch):
                micro = local.slice(micro_start, micro_start + micro_batch)
                loss_sum, micro_stats = loss_fn(micro)
                (loss_sum / num_tokens).backward()
                loss_total += loss_sum.detach() / num_tokens
                stats.append(micro_stats)
            losses.append(all_reduce(loss_total, "sum", self.dp_group))
            norms.append(self.optimizer_step())
        all_tokens = experience.response_mask.sum()
        return {
            "loss": torch.stack(losses).mean(),
            "grad_norm": torch.stack(norms).mean(),
            "lr": torch.tensor(self.scheduler.get_last_lr()[0]),
            **normalise(reduce_across_ranks(reduce_stats(stats), self.dp_group), all_tokens),
        }

    def state_dict(self) -> dict:
        """Model and optimizer state in the torch.distributed.checkpoint layout (sharded where the model is)."""
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optim_state}

    def load_state_dict(self, state: dict) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])

    def extra_state(self) -> dict:
        """What every rank holds identically: schedule position and the skipped-step count."""
        return {"scheduler": self.scheduler.state_dict(), "skipped_steps": self.skipped_steps}

    def load_extra_state(self, state: dict) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.skipped_steps = int(state["skipped_steps"])
