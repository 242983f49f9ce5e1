"""Where a worker's model lives: its parallel layout, its mesh, and moving rows between ranks."""

from __future__ import annotations

import torch
from torch import nn

from dtppo.config import ParallelConfig
from dtppo.distributed.comm import all_gather_rows, world_size
from dtppo.distributed.parallel_dims import ParallelDims, dp_coordinate, dp_group
from dtppo.distributed.parallelize import parallelize
from dtppo.types import Experience


class Placement:
    """A worker's ranks: ``dp`` row shards × ``tp`` model shards over all launched ranks."""

    def __init__(self, parallel: ParallelConfig):
        self.dims = ParallelDims(world_size(), parallel.tp, parallel.sequence_parallel)
        self.mesh = self.dims.build_mesh()
        self.dp_rank, self.dp_size = dp_coordinate(self.mesh)
        self.dp_group = dp_group(self.mesh)

    @property
    def sharded(self) -> bool:
        return self.mesh is not None

    def wrap(self, model: nn.Module) -> nn.Module:
        """TP(+SP) then FSDP2 when there is more than one rank; the model itself otherwise."""
        return parallelize(model, self.mesh, self.dims) if self.sharded else model

    def my_rows(self, num_rows: int) -> slice:
        size = num_rows // self.dp_size
        return slice(self.dp_rank * size, (self.dp_rank + 1) * size)

    def gather(self, x: torch.Tensor, pad_value: float = 0) -> torch.Tensor:
        """Rows computed by each dp rank, concatenated back into the whole batch (on every rank)."""
        return all_gather_rows(x, self.dp_group, pad_value) if self.sharded else x

    def gather_experience(self, part: Experience, pad_id: int) -> Experience:
        return Experience(
            input_ids=self.gather(part.input_ids, pad_id),
            attention_mask=self.gather(part.attention_mask),
            response_mask=self.gather(part.response_mask),
            gen_logprobs=self.gather(part.gen_logprobs),
            truncated=self.gather(part.truncated),
        )


def pad_to(x: torch.Tensor, width: int, value: float = 0) -> torch.Tensor:
    """Right-pad (or keep) dim 1 of ``x`` [B, T] to ``width``."""
    if x.shape[1] >= width:
        return x[:, :width]
    return torch.cat([x, torch.full((x.shape[0], width - x.shape[1]), value, dtype=x.dtype)], dim=1)
