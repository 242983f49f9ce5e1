"""Atomic step checkpoints: ``<dir>/step_N/`` is written as ``tmp_step_N/`` and renamed when complete.

A directory named ``step_N`` is therefore always whole; leftovers named ``tmp_*`` from a crash are ignored
and removed by the next save. ``keep_last`` bounds disk use.
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
import yaml

_STEP_DIR = re.compile(r"^step_(\d+)$")
STATE_FILE = "state.pt"
CONFIG_FILE = "config.yaml"


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def save(checkpoint_dir: str | Path, step: int, state: dict[str, Any], config: dict[str, Any], keep_last: int) -> Path:
    """Write ``state`` (tensors, optimizer states, counters) and the resolved config as ``step_<step>``."""
    root = Path(checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    final, tmp = root / f"step_{step}", root / f"tmp_step_{step}"
    for leftover in root.glob("tmp_step_*"):
        shutil.rmtree(leftover, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / STATE_FILE)
    (tmp / CONFIG_FILE).write_text(yaml.safe_dump(config, sort_keys=False))
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    for old in complete_steps(root)[:-keep_last]:
        shutil.rmtree(root / f"step_{old}", ignore_errors=True)
    return final


def complete_steps(checkpoint_dir: str | Path) -> list[int]:
    """Steps with a complete checkpoint, ascending."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    steps = [int(m.group(1)) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()]
    return sorted(steps)


def latest_step(checkpoint_dir: str | Path) -> int | None:
    steps = complete_steps(checkpoint_dir)
    return steps[-1] if steps else None


def load(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state, config mapping) of one ``step_N`` directory."""
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"not a complete checkpoint: {path}")
    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
    config = yaml.safe_load((path / CONFIG_FILE).read_text())
    return state, config


def _fsync_dir(path: Path) -> None:
    for file in path.iterdir() if path.is_dir() else []:
        if file.is_file():
            with file.open("rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
