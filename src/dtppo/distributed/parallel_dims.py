"""Named data-parallel / tensor-parallel layout of one worker's ranks, and its device mesh."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh


class MeshAxis(StrEnum):
    DP_REPLICATE = "dp_replicate"  # whole-model replicas (HSDP): gradients all-reduced across them
    DP_SHARD = "dp_shard"  # FSDP2 shards parameters within a replica
    TP = "tp"  # tensor (and sequence) parallel within a model shard
    DP = "dp"  # dp_replicate × dp_shard flattened: the ranks that split the batch
    DP_TP = "dp_tp"  # all three flattened: every rank of the model (one group for the gradient norm)


@dataclass(frozen=True)
class ParallelDims:
    """world = dp × tp, dp = dp_replicate × dp_shard. ``tp`` ranks that share a dp coordinate see the same rows."""

    world_size: int
    tp: int = 1
    sequence_parallel: bool = False
    dp_replicate: int = 1

    def __post_init__(self) -> None:
        assert self.world_size % (self.tp * self.dp_replicate) == 0, "validated at config load"

    @property
    def dp(self) -> int:
        return self.world_size // self.tp

    @property
    def dp_shard(self) -> int:
        return self.dp // self.dp_replicate

    def build_mesh(self, ranks: range) -> tuple[DeviceMesh, DeviceMesh, DeviceMesh]:
        """The 3-D (dp_replicate, dp_shard, tp) mesh over ``ranks`` (of size ``world_size``), its two dp
        axes flattened into one (the ranks that split the batch), and all three flattened (every rank).

        Collective over *all* launched ranks, members or not: every rank must build every pool's mesh, in
        the same order, because creating a process group is itself a world-wide collective.
        """
        assert len(ranks) == self.world_size
        device = "cuda" if torch.cuda.is_available() else "cpu"
        layout = torch.tensor(list(ranks)).view(self.dp_replicate, self.dp_shard, self.tp)
        mesh = DeviceMesh(device, layout, mesh_dim_names=(MeshAxis.DP_REPLICATE, MeshAxis.DP_SHARD, MeshAxis.TP))
        return mesh, fsdp_mesh(mesh)._flatten(MeshAxis.DP), mesh._flatten(MeshAxis.DP_TP)


def fsdp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The (dp_replicate, dp_shard) mesh FSDP2 shards over: HSDP when dp_replicate > 1, plain FSDP otherwise
    (FSDP2 treats a size-1 replicate axis as no replication)."""
    return mesh[(MeshAxis.DP_REPLICATE, MeshAxis.DP_SHARD)]


def dp_coordinate(dp_mesh: DeviceMesh | None) -> tuple[int, int]:
    """(this rank's index among the ranks that split the batch, their number); (0, 1) in a single process."""
    if dp_mesh is None:
        return 0, 1
    return dp_mesh.get_local_rank(), dp_mesh.size()


def dp_group(dp_mesh: DeviceMesh | None) -> dist.ProcessGroup | None:
    return None if dp_mesh is None else dp_mesh.get_group()
