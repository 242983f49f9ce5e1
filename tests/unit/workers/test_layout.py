"""A worker's pool of ranks (``dtppo.workers.layout``) in one process: one data-parallel rank holding every row, the
model on this device unsharded, a map over rows in chunks (each trimmed to its longest row) gathered back with zeros
on the padding whatever the function returns there, rollout fields gathered, and a frozen replica in the compute
dtype. On ranks: tests/distributed/test_parity.py and test_other_layouts.py."""

import pytest
import torch
from torch import nn

from dtppo.config import ParallelConfig
from dtppo.distributed.parallelize import compute_dtype
from dtppo.workers.layout import RankLayout, pad_to
from tests.support.episodes import hand_episode


def test_one_process_is_one_unsharded_data_parallel_rank_with_every_row():
    layout = RankLayout(ParallelConfig())
    assert not layout.sharded and layout.member and (layout.dp_rank, layout.dp_size) == (0, 1)
    assert layout.shards is None and layout.dp_group is None and layout.my_rows(6) == slice(0, 6)


def test_map_rows_runs_in_chunks_trimmed_to_their_rows_and_zeroes_the_padding():
    e = hand_episode()  # rows of 10 and 3 tokens
    seen = []

    def fn(rows):
        seen.append(tuple(rows.input_ids.shape))
        return torch.where(rows.attention_mask.bool(), rows.input_ids.float(), float("nan"))  # NaN: poison

    out = RankLayout(ParallelConfig()).map_rows(e, fn, chunk_size=1)
    assert seen == [(1, 10), (1, 3)]
    assert torch.equal(out, e.input_ids.float() * e.attention_mask)
    assert not out.isnan().any()


def test_gathering_in_one_process_is_the_rows_themselves():
    layout, e = RankLayout(ParallelConfig()), hand_episode()
    assert layout.gather(e.response_mask) is e.response_mask
    gathered = layout.gather_experience(e.replace(rewards=torch.ones(2)), pad_id=0)
    assert gathered.rewards is None and torch.equal(gathered.turn_ids, e.turn_ids)


def test_a_replica_is_a_frozen_copy_in_the_compute_dtype():
    model = nn.Linear(3, 2)
    replica = RankLayout(ParallelConfig()).replica(model)
    assert replica is not model and not replica.training
    assert all(not p.requires_grad and p.dtype == compute_dtype() for p in replica.parameters())  # fp32 on a CPU
    with torch.no_grad():
        model.weight.add_(1.0)
    assert not torch.equal(replica.weight, model.weight)


def test_wrapping_in_one_process_moves_the_model_to_this_device():
    layout = RankLayout(ParallelConfig())
    wrapped = layout.wrap(nn.Linear(3, 2))
    assert isinstance(wrapped, nn.Linear) and wrapped.weight.device.type == layout.device.type


@pytest.mark.parametrize("width, want", [(5, [[1, 2, 3, 9, 9]]), (2, [[1, 2]]), (3, [[1, 2, 3]])])
def test_pad_to_right_pads_or_cuts_to_the_width(width, want):
    assert pad_to(torch.tensor([[1, 2, 3]]), width, value=9).tolist() == want
