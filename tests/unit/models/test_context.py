"""A context-parallel forward's rows (``dtppo.models.context``), worked out for every rank in one process: the rows
padded to a multiple of 2·cp with token 0, positions continuing each row's last sequence into the padding, each
rank's share of tokens and positions, per-token tensors cut the same way, padded rows refused, and the gathered
result trimmed back to the rows' width. Across ranks: tests/distributed/test_context_parallel.py."""

import pytest
import torch

from dtppo.distributed.context import ContextShards
from dtppo.models.context import ContextForward

IDS = torch.tensor([[11, 12, 13, 14, 15, 16, 17], [21, 22, 23, 24, 25, 26, 27]])  # width 7 -> padded to 8 (cp 2)


def _forwards(position_ids=None, sequence_starts=None):
    return [ContextForward.of(ContextShards(r, 2), IDS, position_ids, sequence_starts) for r in range(2)]


def test_the_ranks_tokens_are_the_padded_rows_cut_zigzag():
    ranks = _forwards()
    assert ranks[0].input_ids.tolist() == [[11, 12, 17, 0], [21, 22, 27, 0]]  # chunks 0 and 3 of 2 tokens
    assert ranks[1].input_ids.tolist() == [[13, 14, 15, 16], [23, 24, 25, 26]]
    assert ranks[0].position_ids.tolist() == [[0, 1, 6, 7]] * 2 and ranks[1].position_ids.tolist() == [[2, 3, 4, 5]] * 2
    assert all(f.width == 7 for f in ranks)


def test_packed_rows_keep_their_per_sequence_positions_and_the_padding_continues_the_last():
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3]] * 2)
    starts = torch.zeros(2, 7, dtype=torch.bool)
    starts[:, 3] = True
    ranks = _forwards(positions, starts)
    assert ranks[0].position_ids[0].tolist() == [0, 1, 3, 4] and ranks[1].position_ids[0].tolist() == [2, 0, 1, 2]
    every = torch.cat([f.rows.shards.local_index(8)[None] for f in ranks], dim=1)
    assert sorted(every[0].tolist()) == list(range(8))


def test_a_per_token_tensor_is_cut_as_the_tokens_are_with_zeros_on_the_padding():
    values = torch.arange(1.0, 15.0).reshape(2, 7, 1)
    ranks = _forwards()
    assert ranks[0].shard(values)[0, :, 0].tolist() == [1.0, 2.0, 7.0, 0.0]
    assert ranks[1].shard(values)[1, :, 0].tolist() == [10.0, 11.0, 12.0, 13.0]


def test_rows_with_a_padding_mask_are_refused():
    with pytest.raises(ValueError, match="right-padded or packed rows"):
        ContextForward.of(ContextShards(0, 2), IDS, attention_mask=torch.ones_like(IDS))


def test_with_one_rank_the_gathered_result_is_the_rows_width():
    forward = ContextForward.of(ContextShards(0, 1), IDS)
    assert forward.input_ids.shape == (2, 8) and forward.input_ids[:, 7].eq(0).all()
    local = torch.randn(2, 8, 3)
    assert torch.equal(forward.gather(local), local[:, :7])
