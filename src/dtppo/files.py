"""Writes that a kill cannot leave half done: a file or a directory appears whole under its final name, or the old
one stays. Every tmp-then-rename of dtppo goes through here (the checkpoint store, the metrics log, the SFT model
directory, the trackers' run ids; bench/ writes its records with it too)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def write_file(path: str | Path, data: bytes | str) -> None:
    """``path`` holds ``data`` whole, or what it held before: written beside it, flushed to disk, renamed over it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def replace_dir(tmp: str | Path, final: str | Path) -> None:
    """The finished directory ``tmp`` becomes ``final``; an existing ``final`` is first set aside and removed
    (``discard_dir``), so no partial directory is ever seen under the final name."""
    final = Path(final)
    if final.exists():
        discard_dir(final)
    os.replace(tmp, final)


def discard_dir(path: str | Path) -> None:
    """Remove a directory without exposing a partial one under its name: renamed to ``tmp_discard_<name>`` first (a
    name that checkpoint directories' clean-up removes, and no reader takes for a result)."""
    path = Path(path)
    trash = path.with_name(f"tmp_discard_{path.name}")
    shutil.rmtree(trash, ignore_errors=True)
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)
