"""The named layout of a worker's ranks (``dtppo.distributed.parallel_dims``): world = dp × cp × tp with
dp = dp_replicate × dp_shard, and a single process's data-parallel coordinate. The device meshes built over ranks:
tests/distributed/test_other_layouts.py."""

import pytest

from dtppo.distributed.parallel_dims import MeshAxis, ParallelDims, dp_coordinate, dp_group


@pytest.mark.parametrize(
    "dims, dp, dp_shard",
    [
        (ParallelDims(world_size=1), 1, 1),
        (ParallelDims(world_size=8, tp=2), 4, 4),
        (ParallelDims(world_size=8, tp=2, dp_replicate=2), 4, 2),
        (ParallelDims(world_size=16, cp=2, tp=2, dp_replicate=2), 4, 2),
    ],
)
def test_the_data_parallel_ranks_are_the_world_over_cp_and_tp(dims, dp, dp_shard):
    assert (dims.dp, dims.dp_shard) == (dp, dp_shard)
    assert dims.dp_replicate * dims.dp_shard * dims.cp * dims.tp == dims.world_size


def test_a_world_the_axes_do_not_divide_is_refused():
    with pytest.raises(AssertionError):
        ParallelDims(world_size=6, tp=4)


def test_a_single_process_is_rank_0_of_1_with_no_group():
    assert dp_coordinate(None) == (0, 1) and dp_group(None) is None


def test_the_axes_are_named_as_the_meshes_name_them():
    assert [a.value for a in MeshAxis][:4] == ["dp_replicate", "dp_shard", "cp", "tp"]
