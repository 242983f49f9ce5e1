"""Rank launchers: where the ranks of a run start (this machine, or Ray actors).

A run is SPMD: every rank executes the same function (the PPO loop) with the process group initialised and
builds the workers it holds itself. A launcher starts ranks, not workers: Ray wraps a whole rank in an actor
(``launch.ray.RayRank``), never a policy or value worker, so the trainer, workers and algorithm do not
change with the launcher.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch.multiprocessing as mp

from dtppo.distributed.launch import run_ranks
from dtppo.errors import GenerationError


class RankLauncher(Protocol):
    world_size: int

    def run(self, fn: Callable[..., None], *args) -> None:
        """Call ``fn(*args)`` on every rank; return when all finished, raise naming the rank if one failed."""

    def shutdown(self) -> None:
        """Release processes and resources; leaves nothing running."""


class LocalLauncher:
    """Ranks on this machine: this process alone, or local processes (or the torchrun ranks); the last
    ``generation_ranks`` of them generate (``cluster.generation_ranks``). ``preload``: modules the ranks import,
    loaded once before local ranks are started (``run_ranks``)."""

    def __init__(self, world_size: int, generation_ranks: int = 0, preload: tuple[str, ...] = ()):
        self.world_size, self.generation_ranks, self.preload = world_size, generation_ranks, preload

    def run(self, fn: Callable[..., None], *args) -> None:
        try:
            run_ranks(fn, self.world_size, *args, generation_ranks=self.generation_ranks, preload=self.preload)
        except mp.ProcessExitedException as err:
            first_generation = self.world_size - self.generation_ranks
            if self.generation_ranks == 0 or err.error_index < first_generation:
                raise
            # The rank died without a word (killed, out of memory): the training ranks were stopped with it.
            how = f"was killed by {err.signal_name}" if err.signal_name else f"exited with code {err.exit_code}"
            rank = f"generation rank {err.error_index - first_generation} (rank {err.error_index}, pid {err.error_pid})"
            raise GenerationError(f"{rank} {how}; the run stopped") from None

    def shutdown(self) -> None:
        pass
