"""What the learning experiments over SFT models share (bench/learning/async_lag.py, episodes.py,
lora.py): dtppo run in a subprocess, each SFT model trained once with its exit code kept beside it, a model
below its floor left out as every protocol says, and the per-arm and paired table."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path

from bench.common.paths import LEARNING, REPO
from bench.common.stats import ci_cell

COMMON = ["checkpointing.enabled=false", "logger.tensorboard=false", "logger.progress=false", "ppo.seed=0"]
BELOW_FLOOR = 5  # dtppo sft's exit code for a model below sft.min_accuracy


def run_dtppo(argv: list[str], log: Path, env_extra: dict[str, str] | None = None, allowed=(0,)) -> int:
    """``python -m dtppo ARGV`` from the repository, one OpenMP thread, its output in ``log``; its exit code, which
    must be in ``allowed``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env_extra or {}))
    with log.open("w") as out:
        proc = subprocess.run([sys.executable, "-m", "dtppo", *argv], cwd=REPO, env=env, stdout=out, stderr=out)
    if proc.returncode not in allowed:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}, see {log}")
    return proc.returncode


def train_sft(recipe: str, root: Path, seed: int, sft_args: list[str]) -> int:
    """SFT model ``seed`` of ``recipe`` (``sft_args``: its seed and output directory), trained once; its exit code,
    0 or below-floor, is kept in ``root/sft<seed>.exit_code`` for later runs."""
    marker = REPO / root / f"sft{seed}.exit_code"
    if not marker.is_file():
        marker.parent.mkdir(parents=True, exist_ok=True)
        argv = ["sft", recipe, *COMMON, *sft_args]
        marker.write_text(str(run_dtppo(argv, marker.with_suffix(".log"), allowed=(0, BELOW_FLOOR))))
    return int(marker.read_text())


def usable_sft_models(
    pool: Executor, recipe: str, root: Path, seeds: list[int], sft_args: Callable[[Path, int], list[str]]
) -> list[int]:
    """The seeds whose SFT model of ``recipe`` reached its floor (each trained in ``pool`` by :func:`train_sft`,
    ``sft_args(root, seed)`` its seed and output directory); the others are named and left out."""
    jobs = {seed: pool.submit(train_sft, recipe, root, seed, sft_args(root, seed)) for seed in seeds}
    usable = [seed for seed, job in jobs.items() if job.result() == 0]
    for seed in sorted(set(seeds) - set(usable)):
        print(f"SFT model {seed} ended below its floor (sft.min_accuracy): left out, as the protocol says")
    return usable


def print_summary(per_arm: dict, sections: dict[str, dict], metrics: list[str], width: int) -> None:
    """Each arm's mean [95 % interval] per metric, then each section of paired differences (``ci_cell``)."""
    print(f"\n{'arm':<{width}}" + "".join(f"{m:>34}" for m in metrics))
    for arm, figures in per_arm.items():
        print(f"{arm:<{width}}" + "".join(f"{ci_cell(figures[m]):>34}" for m in metrics))
    for title, differences in sections.items():
        print(f"\n{title} (paired by SFT model; * = the 95 % interval excludes 0)")
        for name, figures in differences.items():
            print(f"{name:<{width}}" + "".join(f"{ci_cell(s, True):>35}" for s in figures.values()))


def parser(description: str, root: str, out: str, jobs_help: str) -> argparse.ArgumentParser:
    """The options every experiment takes: its SFT seeds, runs side by side, where runs go and the JSON."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--sft-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2, help=jobs_help)
    parser.add_argument("--root", type=Path, default=Path("runs") / root)
    parser.add_argument("--out", type=Path, default=LEARNING / out)
    return parser
