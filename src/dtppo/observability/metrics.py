"""Reducing per-microbatch statistics into step metrics, with one host sync per phase.

Statistic names carry their reduction: ``*_sum`` is added up and later divided by a token count, ``*_min``
and ``*_max`` keep the extreme (±inf when a microbatch had no valid token). Values stay tensors until
:func:`to_floats` runs once at the end of a phase.
"""

from __future__ import annotations

import math

import torch

from dtppo.distributed.comm import all_reduce


def reduce_stats(stats: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Combine microbatch statistics by the suffix of their name."""
    out: dict[str, torch.Tensor] = {}
    for item in stats:
        for name, value in item.items():
            if name not in out:
                out[name] = value.clone()
            elif name.endswith("_min"):
                out[name] = torch.minimum(out[name], value)
            elif name.endswith("_max"):
                out[name] = torch.maximum(out[name], value)
            else:
                out[name] = out[name] + value
    return out


def reduce_across_ranks(stats: dict[str, torch.Tensor], group=None) -> dict[str, torch.Tensor]:
    """Combine statistics of data-parallel ranks by name suffix: one collective per reduction kind."""
    out = dict(stats)
    for op, keys in [
        ("min", [k for k in stats if k.endswith("_min")]),
        ("max", [k for k in stats if k.endswith("_max")]),
        ("sum", [k for k in stats if not k.endswith(("_min", "_max"))]),
    ]:
        if keys:
            reduced = all_reduce(torch.stack([stats[k].reshape(()).float() for k in keys]), op, group)
            out |= dict(zip(keys, reduced.unbind()))
    return out


def mean_over(runs: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Combine whole-pass metrics of several epochs: extremes stay extremes, everything else is averaged."""
    total = reduce_stats(runs)
    return {k: v if k.endswith(("_min", "_max")) else v / len(runs) for k, v in total.items()}


def normalise(stats: dict[str, torch.Tensor], num_tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Turn ``x_sum`` into ``x`` (a token mean); keep mins and maxes."""
    return {
        (name[: -len("_sum")] if name.endswith("_sum") else name): (
            value / num_tokens.clamp(min=1) if name.endswith("_sum") else value
        )
        for name, value in stats.items()
    }


def to_floats(metrics: dict[str, torch.Tensor | float]) -> dict[str, float]:
    """The phase's single host sync: every metric as a Python float (±inf extremes become -1.0, as NeMo-RL)."""
    keys = list(metrics)
    values = torch.stack([torch.as_tensor(metrics[k], dtype=torch.float64).reshape(()) for k in keys]).tolist()
    return {
        k: (-1.0 if math.isinf(v) and (k.endswith("_min") or k.endswith("_max")) else v) for k, v in zip(keys, values)
    }
