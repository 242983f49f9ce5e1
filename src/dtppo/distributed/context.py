"""Context parallelism: one row's tokens split over the ``cp`` ranks of a group, and gathered back.

Layouts: ``zigzag`` (head-tail, the default): a row of width W (a multiple of 2·cp) is cut into 2·cp chunks of
W / (2·cp) tokens and rank r holds chunks r and 2·cp - 1 - r, so under causal attention every rank has the same
work; ``contiguous``: rank r holds the r-th W / cp tokens, and the last rank attends to the most keys. Everything
that looks one token back (next-token ids, the V(s_t) shift) is done on the global row: a rank's tokens are never
shifted on their own (docs/design/sequences.md).

Gathers come in two kinds, by what the gradient of the gathered tensor is on each rank:

- :meth:`ContextShards.gather_outputs`: per-token outputs (log-probs, the value head's) whose gathered row feeds a
  loss every rank of the group computes identically, so each rank's upstream gradient is the whole row's and the
  backward keeps this rank's slice (summing would count the gradient cp times);
- :meth:`ContextShards.gather_keys`: keys and values for attention, whose upstream gradient on each rank comes
  from that rank's queries only, so the backward sums the group's gradients and keeps this rank's slice.

The parameters' gradients are then each rank's tokens' share, summed over the group by FSDP (sharded over
dp × cp, summing): the loss counts once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class ContextShards:
    """This rank's part of each row: ``size`` ranks in ``group`` (None: a single process, for tests), this one
    ``rank`` among them, tokens laid out as ``layout`` (``zigzag`` or ``contiguous``)."""

    rank: int
    size: int
    group: dist.ProcessGroup | None = None
    layout: str = "zigzag"

    def width(self, tokens: int) -> int:
        """The row width a layout of ``tokens`` is padded to: the next multiple of 2·cp."""
        return -(-tokens // (2 * self.size)) * 2 * self.size

    def chunks(self, width: int) -> tuple[tuple[int, int], ...]:
        """This rank's global token ranges [start, end) of a row of ``width`` (a multiple of 2·cp), in the order
        its local tokens hold them."""
        if self.layout == "contiguous":
            share = width // self.size
            return ((self.rank * share, (self.rank + 1) * share),)
        chunk = width // (2 * self.size)
        head, tail = self.rank, 2 * self.size - 1 - self.rank
        return (head * chunk, (head + 1) * chunk), (tail * chunk, (tail + 1) * chunk)

    def local_index(self, width: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Global positions of this rank's tokens, in local order. -> [width / cp] int64."""
        return _layout_index(self.size, self.layout, width)[self.rank].to(device)

    def shard(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's tokens of global rows. x: [B, W, ...] (W a multiple of 2·cp) -> [B, W / cp, ...]."""
        return x[:, self.local_index(x.shape[1], x.device)]

    def gather_outputs(self, local: torch.Tensor) -> torch.Tensor:
        """Global rows from every rank's tokens. local: [B, W / cp, ...] -> [B, W, ...]. Backward: this rank's
        slice of the (replicated) row gradient."""
        return _Gather.apply(local, self, False)

    def gather_keys(self, local: torch.Tensor, dim: int = 2) -> torch.Tensor:
        """Keys or values of the whole row. local: [B, H, W / cp, D] (tokens on ``dim``) -> [B, H, W, D].
        Backward: the group's gradients summed, this rank's slice."""
        return _Gather.apply(local.transpose(1, dim), self, True).transpose(1, dim)


@functools.lru_cache(maxsize=64)
def _layout_index(size: int, layout: str, width: int) -> torch.Tensor:
    """Every rank's global token positions of a row of ``width``: [cp, width / cp] int64 (computed once per shape:
    each layer's gathers read it)."""
    ranks = [ContextShards(rank, size, layout=layout).chunks(width) for rank in range(size)]
    return torch.stack([torch.cat([torch.arange(start, end) for start, end in chunks]) for chunks in ranks])


@functools.lru_cache(maxsize=64)
def _global_order(size: int, layout: str, width: int) -> torch.Tensor:
    """Where each global position lies among the ranks' tokens laid end to end, rank by rank: [width] int64."""
    return _layout_index(size, layout, width).flatten().argsort()


def _all_gather(local: torch.Tensor, shards: ContextShards) -> torch.Tensor:
    """[B, n, ...] from each rank -> [B, cp·n, ...] in global token order."""
    parts = [torch.empty_like(local) for _ in range(shards.size)]
    dist.all_gather(parts, local.contiguous(), group=shards.group)
    order = _global_order(shards.size, shards.layout, local.shape[1] * shards.size).to(local.device)
    return torch.cat(parts, dim=1).index_select(1, order)


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local, shards: ContextShards, sum_grads: bool):
        ctx.shards, ctx.sum_grads = shards, sum_grads
        return _all_gather(local, shards) if shards.size > 1 else local.clone()

    @staticmethod
    def backward(ctx, grad):
        shards = ctx.shards
        if ctx.sum_grads and shards.size > 1:
            # gloo has no reduce-scatter: the sum on every rank, then this rank's slice.
            grad = grad.contiguous()
            dist.all_reduce(grad, group=shards.group)
        return shards.shard(grad), None, None
