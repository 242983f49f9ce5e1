"""Atomic step checkpoints: ``<dir>/step_N/`` is written as ``tmp_step_N/`` and renamed when complete.

Layout of ``step_N/``: ``weights/`` (torch.distributed.checkpoint: policy and value models and optimizers,
sharded as trained, loadable on any number of ranks), ``trainer.pt`` (replicated state: schedulers, loader
position, RNG, counters) and ``config.yaml``. A directory named ``step_N`` is always whole; ``tmp_*``
leftovers of a crash are ignored and removed by the next save. ``keep_last`` bounds disk use.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
import yaml

from dtppo.distributed.comm import barrier, rank

_STEP_DIR = re.compile(r"^step_(\d+)$")
WEIGHTS_DIR = "weights"
TRAINER_FILE = "trainer.pt"
CONFIG_FILE = "config.yaml"


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def save(checkpoint_dir: str | Path, step: int, sharded: dict[str, Any], replicated: dict[str, Any],
         config: dict[str, Any], keep_last: int) -> Path:
    """Collective: every rank writes its shards of ``sharded``; rank 0 writes the rest and commits."""
    root = Path(checkpoint_dir)
    final, tmp = root / f"step_{step}", root / f"tmp_step_{step}"
    if rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        for leftover in root.glob("tmp_step_*"):
            shutil.rmtree(leftover, ignore_errors=True)
        tmp.mkdir()
    barrier()
    dcp.save(sharded, checkpoint_id=str(tmp / WEIGHTS_DIR))
    if rank() == 0:
        torch.save(replicated, tmp / TRAINER_FILE)
        (tmp / CONFIG_FILE).write_text(yaml.safe_dump(config, sort_keys=False))
        _fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_tree(root, recurse=False)
        for old in complete_steps(root)[:-keep_last]:
            shutil.rmtree(root / f"step_{old}", ignore_errors=True)
    barrier()
    return final


def complete_steps(checkpoint_dir: str | Path) -> list[int]:
    """Steps with a complete checkpoint, ascending."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    steps = [int(m.group(1)) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and (p / TRAINER_FILE).is_file()]
    return sorted(steps)


def latest_step(checkpoint_dir: str | Path) -> int | None:
    steps = complete_steps(checkpoint_dir)
    return steps[-1] if steps else None


def load(path: str | Path, sharded: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fill ``sharded`` (a state dict of the current layout) in place from ``path``; return the replicated
    state and the config mapping. Any subset of the saved keys may be requested."""
    path = Path(path)
    if not (path / TRAINER_FILE).is_file():
        raise FileNotFoundError(f"not a complete checkpoint: {path}")
    dcp.load(sharded, checkpoint_id=str(path / WEIGHTS_DIR))
    replicated = torch.load(path / TRAINER_FILE, map_location="cpu", weights_only=False)
    return replicated, read_config(path)


def read_config(path: str | Path) -> dict[str, Any]:
    return yaml.safe_load((Path(path) / CONFIG_FILE).read_text())


def _fsync_tree(path: Path, recurse: bool = True) -> None:
    for item in path.rglob("*") if recurse else path.iterdir():
        if item.is_file():
            with item.open("rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
