"""Opt-in profiles of the training updates: with ``DTPPO_PROFILE_DIR=DIR`` set, every ``Updater.train`` call
runs under ``torch.profiler`` and writes ``DIR/<model>_rank<r>_call<n>.json``: its operators ranked by self time on
the device (on the CPU when there is no GPU), with call counts; ``DTPPO_PROFILE_FROM_CALL=n`` profiles only calls
n, n + 1, ... (counted from 1 per model), so that the steps before stay unprofiled and their timings true.
bench/device/gpu.sh sets both to compare where the critic's and the policy's updates spend their time. Unset (the
normal case), nothing is profiled.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

PROFILE_ENV = "DTPPO_PROFILE_DIR"
PROFILE_FROM_ENV = "DTPPO_PROFILE_FROM_CALL"
TOP_OPERATORS = 25


@contextmanager
def profiled(model: str, call: int, rank: int) -> Iterator[None]:
    """Profile the block when ``DTPPO_PROFILE_DIR`` is set and ``call`` is at least ``DTPPO_PROFILE_FROM_CALL``;
    ``model`` ("policy" | "value"), ``call`` and ``rank`` name the file."""
    directory = os.environ.get(PROFILE_ENV, "").strip()
    if not directory or call < int(os.environ.get(PROFILE_FROM_ENV, "1")):
        yield
        return
    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        yield
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    summary = operator_summary(prof.key_averages(), cuda)
    summary |= {"model": model, "call": call, "rank": rank, "wall_s": seconds}
    out = Path(directory) / f"{model}_rank{rank}_call{call}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))


def operator_summary(events, on_device: bool) -> dict:
    """Operators of a profile ranked by self time (device time when ``on_device``), the top ``TOP_OPERATORS``."""

    def device_ms(event) -> float:
        return getattr(event, "self_device_time_total", 0.0) / 1e3

    rows = [
        {"name": e.key, "calls": e.count, "self_device_ms": device_ms(e), "self_cpu_ms": e.self_cpu_time_total / 1e3}
        for e in events
    ]
    key = "self_device_ms" if on_device else "self_cpu_ms"
    rows.sort(key=lambda row: -row[key])
    return {
        "ranked_by": key,
        "total_self_device_ms": sum(r["self_device_ms"] for r in rows),
        "total_self_cpu_ms": sum(r["self_cpu_ms"] for r in rows),
        "top": rows[:TOP_OPERATORS],
    }
