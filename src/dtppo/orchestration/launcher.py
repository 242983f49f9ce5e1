"""Rank launchers: where the ranks of a run start (this machine, or Ray actors).

A run is SPMD: every rank executes the same function (the PPO loop) with the process group initialised and
builds the workers it holds itself. A launcher starts ranks, not workers: Ray wraps a whole rank in an actor
(``ray_launcher.RayRank``), never a policy or value worker, so the trainer, workers and algorithm do not
change with the launcher.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from dtppo.distributed.launch import run_ranks


class RankLauncher(Protocol):
    world_size: int

    def run(self, fn: Callable[..., None], *args) -> None:
        """Call ``fn(*args)`` on every rank; return when all finished, raise naming the rank if one failed."""

    def shutdown(self) -> None:
        """Release processes and resources; leaves nothing running."""


class LocalLauncher:
    """Ranks on this machine: this process alone, or spawned local processes (or the torchrun ranks)."""

    def __init__(self, world_size: int):
        self.world_size = world_size

    def run(self, fn: Callable[..., None], *args) -> None:
        run_ranks(fn, self.world_size, *args)

    def shutdown(self) -> None:
        pass
