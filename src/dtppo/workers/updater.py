"""What both workers share: optimizer and schedule, and the minibatch / microbatch update loop.

Normalisation: each minibatch is one optimizer step; its loss is the per-token losses summed with the
aggregation's weights (``algorithms.aggregation``: token-mean, sequence-mean, ...), computed once over the whole
minibatch before the microbatch loop and carried by its rows (``Experience.loss_weights``). Any microbatch size,
accumulation count, token-budget grouping (``token_budget_microbatches``) or data-parallel size therefore gives the
same gradient.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from dtppo.algorithms.aggregation import loss_token_weights
from dtppo.config import OptimizerConfig, SchedulerConfig
from dtppo.distributed.comm import all_reduce, rank
from dtppo.distributed.grad_norm import clip_grad_norm_
from dtppo.distributed.parallelize import microbatch_accumulation
from dtppo.errors import NonFiniteError
from dtppo.faults import nonfinite_injected
from dtppo.models.packing import first_fit_decreasing
from dtppo.models.ties import tied_names, untied
from dtppo.observability.metrics import normalise, reduce_across_ranks, reduce_stats
from dtppo.observability.profiling import profiled
from dtppo.types import Experience, balanced_rows

# A microbatch's share of its minibatch's loss (its per-token losses summed with ``micro.loss_weights``) and stats.
LossFn = Callable[[Experience], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def token_budget_microbatches(lengths: torch.Tensor, max_tokens: int) -> list[torch.Tensor]:
    """Rows grouped into microbatches of at most ``max_tokens`` real tokens. lengths: [B] tokens per row (prompt +
    response) -> one [n] int64 index tensor per microbatch; together they hold every row once.

    First-fit decreasing, as sequence packing bins rows (``models.packing.first_fit_decreasing``): a row longer
    than the budget goes alone. Deterministic, so a rerun (or a resume) forms the same microbatches.
    """
    groups = first_fit_decreasing(lengths.cpu().tolist(), max_tokens)
    return [torch.tensor(rows, dtype=torch.long) for rows in groups]


def split_to(groups: list[torch.Tensor], lengths: torch.Tensor, count: int) -> list[torch.Tensor]:
    """``groups`` (index tensors into lengths: [B] tokens per row) split until there are ``count`` (at most B): the
    group with the most tokens among those of two rows or more is cut in two halves, the longer rows first.

    Data-parallel ranks must run the same number of microbatches (each forward's FSDP collectives pair up across
    ranks), and a rank's own grouping may need fewer; splitting only lowers a group's tokens, so the budget holds.
    """
    groups = list(groups)
    while len(groups) < count:
        cut = max((g for g in range(len(groups)) if len(groups[g]) > 1), key=lambda g: int(lengths[groups[g]].sum()))
        rows = groups.pop(cut)
        half = (len(rows) + 1) // 2
        groups[cut:cut] = [rows[:half], rows[half:]]
    return groups


class NonFiniteSteps:
    """The skipped-step counts, kept as device tensors so that counting a step never waits for the device: the
    host reads them once per pass (``check``), with the pass's metrics."""

    def __init__(self, device: torch.device, skipped: int = 0, streak: int = 0):
        self.skipped = torch.tensor(skipped, device=device)
        self.streak = torch.tensor(streak, device=device)
        self.longest = self.streak.clone()  # the longest streak since the last check that passed

    def record(self, finite: torch.Tensor) -> None:
        """finite: [] bool, whether this optimizer step was applied."""
        bad = (~finite).long()
        self.skipped += bad
        self.streak = (self.streak + bad) * bad
        self.longest = torch.maximum(self.longest, self.streak)

    def check(self, limit: int, name: str) -> None:
        """Raise NonFiniteError when a streak reached ``limit`` (0: never)."""
        longest = int(self.longest)
        if limit and longest >= limit:
            raise NonFiniteError(
                f"{name}: {longest} consecutive optimizer steps had a non-finite loss or gradient (limit "
                f"ppo.max_consecutive_nonfinite_steps = {limit}); stopping, the last checkpoint is unaffected"
            )
        self.longest = self.streak.clone()


def fused_step(device: torch.device, params: list[torch.Tensor]) -> bool:
    """Whether the optimizer steps with the fused AdamW: on an accelerator, over plain tensors or DTensors on one
    device mesh (what one fused kernel can take)."""
    meshes = {p.device_mesh for p in params if isinstance(p, DTensor)}
    one_mesh = not meshes or (len(meshes) == 1 and all(isinstance(p, DTensor) for p in params))
    return device.type != "cpu" and one_mesh


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


class Updater:
    """AdamW + LambdaLR over ``model``'s parameters, with grad-norm clipping and non-finite step skipping.

    Data parallel: ``dp_rank``/``dp_size`` pick this rank's rows of each minibatch (an equal number of rows,
    balanced by token count), ``dp_group`` reduces metrics, ``model_group`` (dp × tp ranks) the gradient
    norm. The model is expected to sum (not average) gradients across those ranks (see parallelize()).
    ``aggregation`` and ``horizon`` weigh each minibatch's per-token losses (``algorithms.aggregation``).
    """

    def __init__(
        self,
        model: nn.Module,
        optim: OptimizerConfig,
        schedule: SchedulerConfig,
        max_grad_norm: float,
        device: torch.device = torch.device("cpu"),
        dp_rank: int = 0,
        dp_size: int = 1,
        dp_group=None,
        name: str = "model",
        max_consecutive_nonfinite: int = 0,
        unsharded_accumulation: bool = False,
        model_group=None,
        aggregation: str = "token-mean",
        horizon: int = 1,
    ):
        self.model, self.device = model, device
        self.aggregation, self.horizon = aggregation, horizon
        # FSDP: gather once per optimizer step, reduce-scatter once (see microbatch_accumulation).
        self.unsharded_accumulation = unsharded_accumulation
        self.max_grad_norm = max_grad_norm
        # ``name`` labels errors and selects the test hook; 0 consecutive-limit = skip forever, never stop.
        self.name, self.max_consecutive_nonfinite = name, max_consecutive_nonfinite
        self.dp_rank, self.dp_size, self.dp_group = dp_rank, dp_size, dp_group
        self.model_group = model_group  # every rank holding the model: the gradient norm's one all-reduce
        # Only what trains: with LoRA the frozen base has no optimizer state, gradient or share in the norm.
        self.params = [p for p in model.parameters() if p.requires_grad]
        # On an accelerator the fused AdamW reads the step's finite flag on the device (GradScaler's ``found_inf``):
        # no host sync per step. It runs one multi-tensor kernel, so only over parameters on a single mesh; on the
        # CPU the flag is in host memory already and the unfused AdamW keeps its numerics.
        self.fused = fused_step(device, self.params)
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=optim.lr,
            betas=optim.betas,
            eps=optim.eps,
            weight_decay=optim.weight_decay,
            foreach=None if dp_group is None or self.fused else False,  # params may live on different meshes
            fused=self.fused or None,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(schedule))
        self.tied = tied_names(model)
        self.nonfinite = NonFiniteSteps(device)
        self.train_calls = 0  # names profile files

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped for a non-finite loss or gradient so far."""
        return int(self.nonfinite.skipped)

    @property
    def consecutive_nonfinite(self) -> int:
        """The current streak of skipped steps."""
        return int(self.nonfinite.streak)

    def optimizer_step(self, loss: torch.Tensor | None = None) -> torch.Tensor:
        """Clip, then step unless the gradient norm or the minibatch ``loss`` is non-finite.

        A skipped step leaves parameters and optimizer state as they were and is counted (``skipped_steps``);
        ``max_consecutive_nonfinite`` skips in a row raise NonFiniteError at the end of the pass (``train``): one
        bad batch is noise, a streak means the weights or the data are broken and more steps only burn compute.
        The decision is the same on every rank: the norm and the loss are global.
        """
        grad_norm = clip_grad_norm_(self.params, self.max_grad_norm, self.model_group)
        finite = torch.isfinite(grad_norm) if loss is None else torch.isfinite(grad_norm) & torch.isfinite(loss)
        if self.fused:
            self.optimizer.found_inf = (~finite).float()  # the fused kernel skips the update and the step count
            self.optimizer.step()
            del self.optimizer.found_inf
        elif bool(finite):  # host memory: no device to wait for
            self.optimizer.step()
        self.nonfinite.record(finite)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return grad_norm.detach()

    def train(
        self,
        experience: Experience,
        loss_fn: LossFn,
        global_batch: int,
        micro_batch: int,
        max_tokens: int | None = None,
    ) -> dict[str, torch.Tensor]:
        """One pass over ``experience`` in minibatches of ``global_batch`` samples (one optimizer step each),
        each rank's share in microbatches of at most ``micro_batch`` rows (a bound, not a divisor), or, when
        ``max_tokens`` is set, of at most ``max_tokens`` real tokens (``token_budget_microbatches``; each rank
        groups its own rows, ``micro_batch`` is then unused).

        Returns tensors: ``loss`` (each minibatch's aggregated loss) and ``grad_norm``, means over optimizer steps,
        ``lr``, and the loss function's statistics reduced over all microbatches (sums normalised by all valid
        tokens, whatever the aggregation).
        Profiled when ``DTPPO_PROFILE_DIR`` is set (``dtppo.observability.profiling``).
        """
        self.train_calls += 1
        with profiled(self.name, self.train_calls, rank()):
            return self._train_pass(experience, loss_fn, global_batch, micro_batch, max_tokens)

    def _microbatches(self, local: Experience, micro_batch: int, max_tokens: int | None) -> list[Experience]:
        if max_tokens is None:
            return [local.slice(start, start + micro_batch) for start in range(0, local.batch_size, micro_batch)]
        lengths = local.attention_mask.sum(-1).cpu()
        groups = token_budget_microbatches(lengths, max_tokens)
        count = all_reduce(torch.tensor(len(groups), device=self.device), "max", self.dp_group)
        return [local.take(rows.to(local.attention_mask.device)) for rows in split_to(groups, lengths, int(count))]

    def _train_pass(
        self, experience: Experience, loss_fn: LossFn, global_batch: int, micro_batch: int, max_tokens: int | None
    ) -> dict[str, torch.Tensor]:
        self.model.train()
        losses, norms, stats = [], [], []
        for start in range(0, experience.batch_size, global_batch):
            minibatch = experience.slice(start, start + global_batch)
            # Every rank holds the whole step's batch, so the minibatch's weights need no collective.
            weights = loss_token_weights(minibatch.train_mask, self.aggregation, self.horizon)
            minibatch = minibatch.replace(loss_weights=weights)
            # Rows spread by token count, not in blocks: a step lasts as long as its slowest rank.
            local = minibatch.take(balanced_rows(minibatch.attention_mask.sum(-1), self.dp_rank, self.dp_size))
            local = local.to(self.device)
            loss_total = torch.zeros((), device=self.device)
            with microbatch_accumulation(self.model, self.unsharded_accumulation) as before_microbatch:
                micros = self._microbatches(local, micro_batch, max_tokens)
                for index, micro in enumerate(micros):
                    before_microbatch(index == len(micros) - 1)
                    loss, micro_stats = loss_fn(micro)
                    if nonfinite_injected(self.name, self.scheduler.last_epoch):
                        loss = loss * float("nan")  # test hook (dtppo.faults): a real overflow's effect
                    loss.backward()
                    loss_total += loss.detach()
                    stats.append(micro_stats)
            losses.append(all_reduce(loss_total, "sum", self.dp_group))
            norms.append(self.optimizer_step(losses[-1]))
        self.nonfinite.check(self.max_consecutive_nonfinite, self.name)
        all_tokens = experience.train_mask.sum().to(self.device)
        metrics = {
            "loss": torch.stack(losses).mean(),
            "grad_norm": torch.stack(norms).mean(),
            "lr": torch.tensor(self.scheduler.get_last_lr()[0]),
            **normalise(reduce_across_ranks(reduce_stats(stats), self.dp_group), all_tokens),
        }
        return {name: value.cpu() for name, value in metrics.items()}

    def state_dict(self) -> dict:
        """Model and optimizer state in the torch.distributed.checkpoint layout (sharded where the model is). A tied
        parameter appears once, under its first name (a tied lm_head is the embedding: +0.9 GB per copy at 1.5B)."""
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": untied(model_state, self.tied), "optim": optim_state}

    def load_state_dict(self, state: dict) -> None:
        """``state`` as :meth:`state_dict` gives it; each tied name is pointed back at the tensor it shares."""
        model_state = dict(state["model"]) | {alias: state["model"][first] for alias, first in self.tied.items()}
        set_state_dict(self.model, self.optimizer, model_state_dict=model_state, optim_state_dict=state["optim"])

    def extra_state(self) -> dict:
        """What every rank holds identically: schedule position and the skipped-step counts (the current
        streak too, so a kill and resume neither forgives nor repeats a run of non-finite steps)."""
        return {
            "scheduler": self.scheduler.state_dict(),
            "skipped_steps": self.skipped_steps,
            "consecutive_nonfinite": self.consecutive_nonfinite,
        }

    def load_extra_state(self, state: dict) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.nonfinite = NonFiniteSteps(
            self.device, int(state["skipped_steps"]), int(state.get("consecutive_nonfinite", 0))
        )
