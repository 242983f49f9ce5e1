"""Named data-parallel / context-parallel / tensor-parallel layout of one worker's ranks, and its device mesh."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh


class MeshAxis(StrEnum):
    DP_REPLICATE = "dp_replicate"  # whole-model replicas (HSDP): gradients all-reduced across them
    DP_SHARD = "dp_shard"  # FSDP2 shards parameters within a replica
    CP = "cp"  # context parallel: the ranks that split each row's tokens
    TP = "tp"  # tensor (and sequence) parallel within a model shard
    DP = "dp"  # dp_replicate × dp_shard flattened: the ranks that split the batch
    DP_SHARD_CP = "dp_shard_cp"  # dp_shard × cp flattened: FSDP2 shards over both (each cp rank has its tokens' grads)
    ALL = "all"  # every axis flattened: every rank of the model (one group for the gradient norm)


@dataclass(frozen=True)
class ParallelDims:
    """world = dp × cp × tp, dp = dp_replicate × dp_shard. ``cp × tp`` ranks that share a dp coordinate see the same
    rows; ``cp_layout``: how the cp ranks split a row (``distributed.context``)."""

    world_size: int
    tp: int = 1
    sequence_parallel: bool = False
    dp_replicate: int = 1
    cp: int = 1
    cp_layout: str = "zigzag"

    def __post_init__(self) -> None:
        assert self.world_size % (self.tp * self.cp * self.dp_replicate) == 0, "validated at config load"

    @property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.cp)

    @property
    def dp_shard(self) -> int:
        return self.dp // self.dp_replicate

    def build_mesh(self, ranks: range) -> Meshes:
        """The 4-D (dp_replicate, dp_shard, cp, tp) mesh over ``ranks`` (of size ``world_size``) and the views
        of it the workers use (:class:`Meshes`).

        Collective over *all* launched ranks, members or not: every rank must build every pool's mesh, in
        the same order, because creating a process group is itself a world-wide collective.
        """
        assert len(ranks) == self.world_size
        device = "cuda" if torch.cuda.is_available() else "cpu"
        layout = torch.tensor(list(ranks)).view(self.dp_replicate, self.dp_shard, self.cp, self.tp)
        names = (MeshAxis.DP_REPLICATE, MeshAxis.DP_SHARD, MeshAxis.CP, MeshAxis.TP)
        root = DeviceMesh(device, layout, mesh_dim_names=names)
        every = root._flatten(MeshAxis.ALL)
        # FSDP2's 2-D view, from the same root as the tp axis (FSDP2 + TP need one root): (dp_shard, cp) as one.
        fsdp_view = every._unflatten(
            0,
            (self.dp_replicate, self.dp_shard * self.cp, self.tp),
            (MeshAxis.DP_REPLICATE, MeshAxis.DP_SHARD_CP, MeshAxis.TP),
        )
        return Meshes(
            root,
            fsdp_view[(MeshAxis.DP_REPLICATE, MeshAxis.DP_SHARD_CP)],
            root[(MeshAxis.DP_REPLICATE, MeshAxis.DP_SHARD)]._flatten(MeshAxis.DP),
            root[MeshAxis.CP],
            every,
        )


class Meshes(NamedTuple):
    """A worker's meshes: ``root`` (dp_replicate, dp_shard, cp, tp), whose ``tp`` axis TP shards over; ``fsdp``
    (dp_replicate, dp_shard × cp), what FSDP2 shards over: HSDP when dp_replicate > 1, plain FSDP otherwise, the
    cp ranks in it because each holds the gradient of its own tokens and their sum is the gradient
    (``distributed.context``); ``dp``, the ranks that split the batch; ``cp``, those that split a row; ``every``,
    all of them (the gradient norm)."""

    root: DeviceMesh
    fsdp: DeviceMesh
    dp: DeviceMesh
    cp: DeviceMesh
    every: DeviceMesh


def dp_coordinate(dp_mesh: DeviceMesh | None) -> tuple[int, int]:
    """(this rank's index among the ranks that split the batch, their number); (0, 1) in a single process."""
    if dp_mesh is None:
        return 0, 1
    return dp_mesh.get_local_rank(), dp_mesh.size()


def dp_group(dp_mesh: DeviceMesh | None) -> dist.ProcessGroup | None:
    return None if dp_mesh is None else dp_mesh.get_group()
