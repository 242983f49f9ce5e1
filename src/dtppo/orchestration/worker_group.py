"""The WorkerGroup protocol and the local implementation.

A run is SPMD: every rank executes the same function (the PPO loop) with the process group initialised.
A WorkerGroup decides where the ranks live; the trainer, workers and algorithm do not change with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from dtppo.distributed.launch import run_ranks


class WorkerGroup(Protocol):
    world_size: int

    def run(self, fn: Callable[..., None], *args) -> None:
        """Call ``fn(*args)`` on every rank; return when all finished, raise naming the rank if one failed."""

    def shutdown(self) -> None:
        """Release processes and resources; leaves nothing running."""


class LocalWorkerGroup:
    """Ranks on this machine: this process alone, or spawned local processes (or the torchrun ranks)."""

    def __init__(self, world_size: int):
        self.world_size = world_size

    def run(self, fn: Callable[..., None], *args) -> None:
        run_ranks(fn, self.world_size, *args)

    def shutdown(self) -> None:
        pass
