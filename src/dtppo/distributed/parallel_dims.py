"""Named data-parallel / tensor-parallel layout of one worker's ranks, and its device mesh."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh


class MeshAxis(StrEnum):
    DP_SHARD = "dp_shard"  # FSDP2 shards parameters and splits the batch over this axis
    TP = "tp"  # tensor (and sequence) parallel within a model replica


@dataclass(frozen=True)
class ParallelDims:
    """world = dp × tp. ``tp`` ranks that share a dp coordinate see the same rows."""

    world_size: int
    tp: int = 1
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        assert self.world_size % self.tp == 0, "validated at config load"

    @property
    def dp(self) -> int:
        return self.world_size // self.tp

    def build_mesh(self, ranks: range) -> DeviceMesh:
        """The 2-D (dp_shard, tp) mesh over ``ranks`` (of size ``world_size``).

        Collective over *all* launched ranks, members or not: every rank must build every pool's mesh, in
        the same order, because creating a process group is itself a world-wide collective.
        """
        assert len(ranks) == self.world_size
        device = "cuda" if torch.cuda.is_available() else "cpu"
        layout = torch.tensor(list(ranks)).view(self.dp, self.tp)
        return DeviceMesh(device, layout, mesh_dim_names=(MeshAxis.DP_SHARD, MeshAxis.TP))


def dp_coordinate(mesh: DeviceMesh | None) -> tuple[int, int]:
    """(this rank's index along dp_shard, dp size); (0, 1) in a single process."""
    if mesh is None:
        return 0, 1
    dp_mesh = mesh[MeshAxis.DP_SHARD]
    return dp_mesh.get_local_rank(), dp_mesh.size()


def dp_group(mesh: DeviceMesh | None) -> dist.ProcessGroup | None:
    return None if mesh is None else mesh[MeshAxis.DP_SHARD].get_group()
