"""Gradient-norm clipping over parameters that may be DTensors on different meshes (TP, FSDP, both)."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def _norm(grad: torch.Tensor) -> torch.Tensor:
    """L2 norm of a whole (possibly sharded) gradient, as a plain tensor; a collective for DTensors."""
    n = torch.linalg.vector_norm(grad, 2, dtype=torch.float32)
    return n.full_tensor() if isinstance(n, DTensor) else n


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm: float) -> torch.Tensor:
    """Scale gradients so their global L2 norm is at most ``max_norm``. Returns the norm before clipping.

    Every rank gets the same norm, because each DTensor norm is reduced over its own mesh.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    total = torch.linalg.vector_norm(torch.stack([_norm(g) for g in grads]), 2)
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef)
    return total
