"""The few collectives the trainer needs; each is the identity in a single process."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def is_main_rank() -> bool:
    return rank() == 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def all_reduce(x: torch.Tensor, op: str = "sum", group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Reduce ``x`` (any shape) over ``group`` (default: all ranks); op is "sum", "min" or "max"."""
    if not is_distributed():
        return x
    out = x.detach().clone()
    dist.all_reduce(
        out, op={"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op], group=group
    )
    return out


def all_gather_rows(x: torch.Tensor, group: dist.ProcessGroup | None = None, pad_value: float = 0) -> torch.Tensor:
    """Concatenate every rank's rows in rank order. x: [b, T, ...] with equal b; T may differ and is padded
    with ``pad_value`` to the longest. Returns [b * group size, T_max, ...]."""
    if not is_distributed():
        return x
    width = int(all_reduce(torch.tensor(x.shape[1]), "max", group)) if x.dim() > 1 else None
    if width is not None and x.shape[1] < width:
        pad = torch.full((x.shape[0], width - x.shape[1], *x.shape[2:]), pad_value, dtype=x.dtype, device=x.device)
        x = torch.cat([x, pad], dim=1)
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts)


def broadcast(x: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Rank ``src``'s ``x`` on every rank (same shape and dtype everywhere)."""
    if not is_distributed():
        return x
    out = x.detach().clone()
    dist.broadcast(out, src=src)
    return out


def broadcast_object(obj: Any, src: int) -> Any:
    """Rank ``src``'s picklable ``obj`` (tensors included, any shapes) on every rank."""
    if not is_distributed():
        return obj
    box = [obj]
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    dist.broadcast_object_list(box, src=src, device=device)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's picklable ``obj``, in rank order, on every rank."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if is_distributed():
        dist.barrier()
