"""Context parallelism's layouts (``dtppo.distributed.context``), worked out in one process: the padded width, each
rank's chunks (zigzag: head and tail, the same causal work on every rank; contiguous: one block), the ranks' tokens
together are the row exactly once, a shard of a row is its tokens at those positions, and with one rank the gathers
are the identity with the identity's gradient. The gathers across ranks: tests/distributed/test_context_parallel.py."""

import pytest
import torch

from dtppo.distributed.context import ContextShards


@pytest.mark.parametrize("cp, tokens, width", [(1, 5, 6), (2, 8, 8), (2, 9, 12), (4, 1, 8), (3, 13, 18)])
def test_a_row_is_padded_to_the_next_multiple_of_two_cp(cp, tokens, width):
    assert ContextShards(0, cp).width(tokens) == width


def test_zigzag_gives_each_rank_a_head_and_a_tail_chunk():
    chunks = [ContextShards(r, 2).chunks(8) for r in range(2)]
    assert chunks == [((0, 2), (6, 8)), ((2, 4), (4, 6))]
    assert ContextShards(1, 2).local_index(8).tolist() == [2, 3, 4, 5]
    assert ContextShards(0, 2).local_index(8).tolist() == [0, 1, 6, 7]


def test_contiguous_gives_each_rank_one_block():
    assert [ContextShards(r, 2, layout="contiguous").chunks(8) for r in range(2)] == [((0, 4),), ((4, 8),)]


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("cp", [2, 3, 4])
def test_the_ranks_tokens_are_the_row_exactly_once(layout, cp):
    width = ContextShards(0, cp).width(21)
    positions = torch.cat([ContextShards(r, cp, layout=layout).local_index(width) for r in range(cp)])
    assert sorted(positions.tolist()) == list(range(width))


@pytest.mark.parametrize("cp", [2, 4])
def test_zigzag_balances_causal_work(cp):
    """Under causal attention a token at position p attends to p + 1 keys: zigzag gives every rank the same sum,
    contiguous gives the last rank the most (the reason for the default)."""
    width = 4 * cp

    def work(layout):
        return [int((ContextShards(r, cp, layout=layout).local_index(width) + 1).sum()) for r in range(cp)]

    assert len(set(work("zigzag"))) == 1
    assert work("contiguous") == sorted(work("contiguous")) and len(set(work("contiguous"))) == cp


def test_a_shard_is_the_rows_tokens_at_the_ranks_positions_with_trailing_dims_kept():
    rows = torch.arange(2 * 8 * 3).reshape(2, 8, 3)
    shard = ContextShards(1, 2).shard(rows)
    assert shard.shape == (2, 4, 3) and torch.equal(shard, rows[:, 2:6])
    assert torch.equal(ContextShards(0, 2).shard(rows), rows[:, [0, 1, 6, 7]])


def test_with_one_rank_the_gathers_are_the_identity_and_pass_the_gradient_through():
    shards = ContextShards(0, 1)
    local = torch.randn(2, 4, requires_grad=True)
    gathered = shards.gather_outputs(local)
    assert torch.equal(gathered, local) and gathered.data_ptr() != local.data_ptr()
    (gathered * torch.arange(4.0)).sum().backward()
    assert torch.equal(local.grad, torch.arange(4.0).expand(2, 4))
    keys = torch.randn(1, 2, 4, 3, requires_grad=True)  # [B, H, W, D]
    assert torch.equal(shards.gather_keys(keys), keys)
