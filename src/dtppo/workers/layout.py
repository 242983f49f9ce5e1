"""Where a worker's model lives on its ranks: its parallel layout, its mesh, and moving rows between ranks."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from dtppo.config import OptimizerConfig, ParallelConfig, SchedulerConfig
from dtppo.distributed.comm import all_gather_rows, is_distributed, rank, world_size
from dtppo.distributed.context import ContextShards
from dtppo.distributed.parallel_dims import ParallelDims, dp_coordinate, dp_group
from dtppo.distributed.parallelize import compute_dtype, parallelize
from dtppo.models.recompute import recompute_blocks
from dtppo.types import ROLLOUT_FIELDS, Experience, block_rows
from dtppo.workers.updater import Updater


class RankLayout:
    """A worker's pool of ranks: ``dp`` row shards × ``cp`` token shards × ``tp`` model shards; the dp ranks hold
    ``dp_replicate`` whole-model replicas, each FSDP-sharded over the rest and the cp ranks. It wraps the model for
    that layout, splits a batch's rows among the dp ranks (the cp and tp ranks of a dp rank see the same rows) and
    gathers their results.

    The pool is every launched rank when policy and critic are colocated, or a contiguous block of ranks
    when they live in separate pools (``cluster.policy_ranks``). Building a RankLayout is collective over all
    launched ranks; on a rank outside the pool it only records that this rank is not a member.
    """

    def __init__(self, parallel: ParallelConfig, ranks: range | None = None):
        ranks = range(world_size()) if ranks is None else ranks
        self.ranks = ranks
        self.dims = ParallelDims(
            len(ranks), parallel.tp, parallel.sequence_parallel, parallel.dp_replicate, parallel.cp, parallel.cp_layout
        )
        # Any multi-process run shards, even a one-rank pool: its collectives must stay inside the pool.
        self.meshes = self.dims.build_mesh(ranks) if is_distributed() else None
        self.member = rank() in ranks
        dp_mesh = self.meshes.dp if self.meshes is not None else None
        self.dp_rank, self.dp_size = dp_coordinate(dp_mesh) if self.member else (0, 1)
        self.dp_group = dp_group(dp_mesh) if self.member else None
        self.model_group = self.meshes.every.get_group() if self.member and self.meshes else None  # grad norm
        # Context parallelism: this rank's share of each row (None: whole rows).
        self.shards = None
        if self.member and parallel.cp > 1:
            cp = self.meshes.cp
            self.shards = ContextShards(cp.get_local_rank(), parallel.cp, cp.get_group(), parallel.cp_layout)
        # Models and their microbatches live on this rank's device; the step's batch stays on the CPU.
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        )

    @property
    def sharded(self) -> bool:
        return self.meshes is not None

    def wrap(self, model: nn.Module, activation_checkpointing: bool = False, cpu_offload: bool = False) -> nn.Module:
        """On this rank's device; then TP(+SP) and FSDP2 when there is more than one rank.

        activation_checkpointing: each decoder block recomputes its activations in backward (``models.recompute``).
        cpu_offload: parameters, gradients and optimizer state in host memory between uses (``parallelize``); the
        model is then not moved to the device first, FSDP2 moves each unit there only to shard it. Without FSDP (a
        single CPU process) everything is in host memory already and the flag changes nothing.
        """
        if activation_checkpointing:
            recompute_blocks(model)
        if not self.sharded:
            return model.to(self.device)
        return parallelize(model if cpu_offload else model.to(self.device), self.meshes, self.dims, cpu_offload)

    def updater(
        self, model: nn.Module, optim: OptimizerConfig, schedule: SchedulerConfig, max_grad_norm: float, **options
    ) -> Updater:
        """An Updater over ``model`` (as ``wrap`` returned it) on this rank's device, training this rank's share of
        each minibatch, its metrics and gradient norm reduced over this layout's groups; ``options``: the updater's
        other keyword arguments (``name``, ``aggregation``, ...)."""
        return Updater(
            model,
            optim,
            schedule,
            max_grad_norm,
            self.device,
            self.dp_rank,
            self.dp_size,
            self.dp_group,
            model_group=self.model_group,
            **options,
        )

    def replica(self, model: nn.Module) -> nn.Module:
        """A frozen whole copy of ``model`` on this rank's device, its parameters in ``compute_dtype()`` (bf16 on
        GPU, what the FSDP2-wrapped model computes in). Buffers keep their dtype, as under FSDP2's mixed precision
        (rotary tables stay fp32). ``load_state_dict`` into it casts, so a refit from fp32 weights needs nothing
        more."""
        copied = copy.deepcopy(model).to(self.device).eval().requires_grad_(False)
        dtype = compute_dtype()
        for param in copied.parameters():  # each tied parameter once
            param.data = param.data.to(dtype)
        return copied

    def my_rows(self, num_rows: int) -> slice:
        return block_rows(num_rows, self.dp_rank, self.dp_size)

    def map_rows(
        self, experience: Experience, fn: Callable[[Experience], torch.Tensor], chunk_size: int
    ) -> torch.Tensor:
        """``fn(rows) -> [b, t]`` over this rank's block of whole rows, in chunks of at most ``chunk_size`` rows
        (each trimmed to its longest row); the blocks are gathered back into ``[B, T]`` on every rank, 0 on
        padding (pads hold no token and no state, whatever the row layout)."""
        local = experience.shard(self.dp_rank, self.dp_size).to(self.device)
        width = local.input_ids.shape[1]
        chunks = [
            pad_to(fn(local.slice(i, i + chunk_size)).cpu(), width) for i in range(0, local.batch_size, chunk_size)
        ]
        out = pad_to(self.gather(torch.cat(chunks)), experience.input_ids.shape[1])
        return out * experience.attention_mask

    def gather(self, x: torch.Tensor, pad_value: float = 0) -> torch.Tensor:
        """Rows computed by each dp rank, concatenated back into the whole batch (on every rank)."""
        return all_gather_rows(x, self.dp_group, pad_value) if self.sharded else x

    def gather_experience(self, part: Experience, pad_id: int) -> Experience:
        """The rows each dp rank sampled (``ROLLOUT_FIELDS``; padding: ``pad_id`` for tokens, else 0)."""
        fields = {name: getattr(part, name) for name in ROLLOUT_FIELDS if getattr(part, name) is not None}
        return Experience(**{n: self.gather(x, pad_id if n == "input_ids" else 0) for n, x in fields.items()})


def pad_to(x: torch.Tensor, width: int, value: float = 0) -> torch.Tensor:
    """Right-pad (or keep) dim 1 of ``x`` [B, T] to ``width``."""
    if x.shape[1] >= width:
        return x[:, :width]
    return torch.cat([x, torch.full((x.shape[0], width - x.shape[1]), value, dtype=x.dtype)], dim=1)
