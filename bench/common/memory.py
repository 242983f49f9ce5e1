"""What the memory benchmarks share (bench/perf/memory_*.py): Linux's resident-set accounting, each measurement in a
fresh process (or group of ranks), the Qwen2.5-0.5B-shaped model they build and the workers' updater."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common.paths import REPO
from bench.common.shapes import QWEN_05B

CHUNK = 128  # policy.logprob_chunk_size's default


def status_kib(field: str) -> int:
    """A field of /proc/self/status (VmRSS, VmHWM) in KiB."""
    with open("/proc/self/status") as fh:
        return int(next(line.split()[1] for line in fh if line.startswith(field + ":")))


def reset_peak() -> int:
    """Reset this process's peak RSS to its current RSS (Linux's clear_refs 5); returns that RSS in KiB. A model's
    build (a whole model before FSDP shards it) must not count as the measured pass's peak."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    return status_kib("VmRSS")


def qwen_config(layers: int):
    """Qwen2.5-0.5B's shape and vocabulary at ``layers`` blocks, SDPA attention."""
    from transformers import Qwen2Config

    config = Qwen2Config(**(QWEN_05B | {"num_hidden_layers": layers}), max_position_embeddings=4096)
    config._attn_implementation = "sdpa"
    return config


def cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def updater(model, layout):
    """The workers' Updater (AdamW at its defaults, clipping at 1) for ``model`` on ``layout``'s ranks."""
    from dtppo.config import OptimizerConfig, SchedulerConfig
    from dtppo.workers.updater import Updater

    return Updater(
        model,
        OptimizerConfig(),
        SchedulerConfig(),
        1.0,
        layout.device,
        layout.dp_rank,
        layout.dp_size,
        layout.dp_group,
        model_group=layout.model_group,
    )


def write_rank_result(out: str, value) -> None:
    """This rank's result as JSON, for :func:`in_child` to read."""
    from dtppo.distributed.comm import rank

    Path(f"{out}.{rank()}").write_text(json.dumps(value))


def in_child(module: str, rank_fn: str, args: tuple, ranks: int, timeout: float | None = None) -> list:
    """``module.rank_fn(*args, out)`` on ``ranks`` ranks of a fresh process (group), killed after ``timeout`` seconds
    (None: no limit); each rank's JSON result. On CUDA one process still joins a one-rank group, as dtppo's ranks do
    (``run_ranks``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/result"
        call = ", ".join(repr(a) for a in (*args, out))
        code = f"from {module} import {rank_fn}; from dtppo.distributed.ranks import run_ranks; "
        code += f"run_ranks({rank_fn}, {ranks}, {call})"
        env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // ranks)))
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{rank_fn}{args} x{ranks} failed:\n{proc.stderr[-3000:]}")
        return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(ranks)]


def largest(per_rank: list[dict]) -> dict:
    """Per key, the largest rank's value (None where the ranks have none)."""
    return {k: None if per_rank[0][k] is None else max(r[k] for r in per_rank) for k in per_rank[0]}


class Probe:
    """This process's RSS (Linux accounting) and, on CUDA, its device allocations, phase by phase."""

    def __init__(self, device):
        import torch

        self.torch, self.cuda = torch, device.type == "cuda"
        self._begin()
        self.at_start = {"resident_MiB": self.rss_start / 1024, "device_resident_MiB": self.device_start}

    def _begin(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()
        self.rss_start = reset_peak()
        self.device_start = self.torch.cuda.memory_allocated() / 2**20 if self.cuda else None
        self.t = time.perf_counter()

    def added(self, name: str) -> dict:
        """MiB added since the phase began, as ``name`` (and ``device_`` + ``name``)."""
        device = self.torch.cuda.memory_allocated() / 2**20 - self.device_start if self.cuda else None
        return {f"{name}_MiB": (status_kib("VmRSS") - self.rss_start) / 1024, f"device_{name}_MiB": device}

    def phase(self, name: str) -> dict:
        """The phase ending now, as ``name``: its peak MiB over its start and its seconds; the next one begins."""
        if self.cuda:
            self.torch.cuda.synchronize()
        device = self.torch.cuda.max_memory_allocated() / 2**20 - self.device_start if self.cuda else None
        out = {
            f"{name}_peak_added_MiB": (status_kib("VmHWM") - self.rss_start) / 1024,
            f"{name}_s": time.perf_counter() - self.t,
            f"device_{name}_peak_added_MiB": device,
        }
        self._begin()
        return out
