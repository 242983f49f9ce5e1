"""Rank launchers: where the ranks of a run start (this machine, or Ray actors), chosen once from the config
(``build_launcher``), and what every rank runs around its work (``run_rank``: a stop printed as one line with its
exit code).

A run is SPMD: every rank executes the same function (the PPO loop) with the process group initialised and
builds the workers it holds itself. A launcher starts ranks, not workers: Ray wraps a whole rank in an actor
(``launch.ray.RayRank``), never a policy or value worker, so the trainer, workers and algorithm do not
change with the launcher.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import torch.multiprocessing as mp

from dtppo.config import ClusterConfig
from dtppo.config.reward_spec import parse_spec
from dtppo.distributed.ranks import run_ranks
from dtppo.errors import BelowFloorError, CheckpointError, GenerationError, InputError, NonFiniteError, RunStopped

DEBUG_ENV = "DTPPO_DEBUG"
_STOPS = (InputError, NonFiniteError, CheckpointError, BelowFloorError, GenerationError)  # by their exit codes


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


def build_launcher(cluster: ClusterConfig) -> RankLauncher:
    """Where the ranks run: this machine (local processes / torchrun) or Ray actors."""
    if cluster.backend == "ray":
        from dtppo.launch.ray import RayLauncher

        launcher = RayLauncher(cluster, cluster.ray_temp_dir)
        print(
            "ranks placed on Ray nodes: "
            + ", ".join(f"rank {r} -> {node}" for r, node in enumerate(launcher.rank_nodes())),
            flush=True,
        )
        return launcher
    # what every rank imports, loaded once in the process local ranks are forked from
    return LocalLauncher(cluster.world_size, cluster.generation_ranks, preload=("dtppo.ppo.entry", "dtppo.sft.trainer"))


def launch(launcher: RankLauncher, fn: Callable[..., None], *args) -> None:
    """``fn(*args)`` on every rank of ``launcher``. A rank that stopped the run on purpose printed why and exited
    with its code: that stop is raised here as its error class, marked as already reported."""
    try:
        launcher.run(fn, *args)
    except RunStopped:  # the launcher's own (a generation rank that died), or a rank in this process
        raise
    except Exception as err:
        code = getattr(err, "exit_code", None)
        stopped = next((cls for cls in _STOPS if cls.exit_code == code), None)
        if stopped is None:
            raise
        error = stopped(f"a rank stopped the run with exit code {code}; its line is above")
        error.reported = True
        raise error from None
    finally:
        launcher.shutdown()


def absolute_paths(tree: dict) -> dict:
    """Ranks may run in another working directory (Ray workers do): anchor every local path at ours.
    Output paths always; input paths only when they exist here, so hub names like "Qwen/..." stay names."""
    tree = copy.deepcopy(tree)
    outputs = [("logger", "log_dir"), ("checkpointing", "checkpoint_dir"), ("sft", "output_dir")]
    inputs = [
        ("policy", "model", "path"),
        ("value", "model", "path"),
        ("reward", "model", "path"),
        ("data", "train", "path"),
        ("data", "validation", "path"),
    ]
    for keys in outputs + inputs:
        *parents, leaf = keys
        node = functools.reduce(lambda section, key: section.setdefault(key, {}), parents, tree)
        value = node.get(leaf)
        if value is not None and (keys in outputs or Path(value).exists()):
            node[leaf] = str(Path(value).resolve())
    reward = tree.setdefault("reward", {})
    if reward.get("functions"):
        reward["functions"] = [parse_spec(spec).absolute() for spec in reward["functions"]]
    return tree


def run_rank(fn: Callable[..., None], *args) -> None:
    """One launched rank running ``fn(*args)`` (module level so spawned processes can import it). A stop is printed
    on the rank that saw it, which then exits with its code: a spawned rank's exception would reach the user as a
    traceback."""
    quiet_transformers()
    with stops_reported():
        fn(*args)


@contextlib.contextmanager
def stops_reported() -> Iterator[None]:
    """A ``RunStopped`` inside becomes its one line on stderr (unless a rank printed it already) and its exit code."""
    try:
        yield
    except RunStopped as err:
        if not err.reported:
            report(err)
        raise SystemExit(err.exit_code) from None


def report(err: RunStopped) -> None:
    """The one line a stopped run leaves on stderr (prefixed with the rank when there are several)."""
    from dtppo.distributed.comm import rank, world_size
    from dtppo.distributed.ranks import run_worlds

    worlds = run_worlds()
    if worlds is not None:  # two worlds: name the rank among all launched ones, and its side
        side = "training" if worlds.generation_rank is None else f"generation rank {worlds.generation_rank}"
        where = f" (rank {worlds.global_rank}, {side})"
    else:
        where = f" (rank {rank()})" if world_size() > 1 else ""
    debug_traceback(err)
    print(f"dtppo: error{where}: {err}", file=sys.stderr, flush=True)


def debug_traceback(err: BaseException) -> None:
    if os.environ.get(DEBUG_ENV) == "1":
        traceback.print_exception(err, file=sys.stderr)


def quiet_transformers() -> None:
    """No per-file progress bars from transformers in logs (each spawned rank or actor calls this too)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
