"""Gradient-norm clipping over parameters that may be DTensors on different meshes (TP, FSDP, both).

One collective per call, whatever the number of parameters: each rank sums the squares of the gradient
pieces it holds, each piece weighted by 1 / (the number of ranks that hold the same piece), and a single
all-reduce over the model's ranks adds those sums into the squared global norm (none when every rank holds
every gradient whole, as pure replicas do).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def _copies(grad: torch.Tensor, group_size: int) -> int:
    """How many of the group's ``group_size`` ranks hold the same local piece of ``grad``: every rank for a plain
    tensor; for a DTensor, the group's ranks over the ranks its shards spread across (its mesh's sharded axes;
    replicated axes, and ranks of the group outside its mesh, hold copies)."""
    if not isinstance(grad, DTensor):
        return group_size
    if any(p.is_partial() for p in grad.placements):
        # A pending sum has no local squared norm; FSDP2 and dtppo's TP plans leave only Shard/Replicate.
        raise ValueError(f"clip_grad_norm_: a gradient with placements {grad.placements} is still a partial sum")
    # Not ``is_shard()``: FSDP2 over a tensor-parallel Shard(0) places ``_StridedShard``, which is no ``Shard``.
    spread = math.prod(grad.device_mesh.size(i) for i, p in enumerate(grad.placements) if not p.is_replicate())
    return group_size // spread


def global_grad_norm(grads: list[torch.Tensor], group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """L2 norm of all ``grads`` together (sharded or not), the same on every rank of ``group``: the ranks that
    hold the model (every rank of its mesh). ``group`` None: a single process, no collective."""
    size = 1 if group is None else dist.get_world_size(group)
    copies = [_copies(g, size) for g in grads]
    # Every rank holding every gradient whole (pure replicas): the local sum is already the global one.
    reduce = any(c < size for c in copies)
    pieces = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    local = torch.stack(
        [
            torch.linalg.vector_norm(p, 2, dtype=torch.float32) ** 2 / (c if reduce else 1)
            for p, c in zip(pieces, copies)
        ]
    ).sum()
    if reduce:
        dist.all_reduce(local, group=group)
    return local.sqrt()


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm: float, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Scale gradients so their global L2 norm is at most ``max_norm``. Returns the norm before clipping.

    ``group``: the ranks that hold the model (None in a single process); every rank gets the same norm.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    total = global_grad_norm(grads, group)
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef)
    return total
