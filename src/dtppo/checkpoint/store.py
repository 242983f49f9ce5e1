"""Atomic, verified step checkpoints: ``<dir>/step_N/`` is written as ``tmp_step_N/`` and renamed when complete.

Layout of ``step_N/``: ``weights/`` (torch.distributed.checkpoint: policy and value models and optimizers,
sharded as trained, loadable on any number of ranks; a tied parameter once), ``trainer.pt`` (replicated state:
schedulers, loader position, RNG, counters), ``config.yaml``, ``hf/`` (the models' HF configs and the tokenizer,
``models.description``) and ``manifest.json`` (size and CRC32 of every other file).

Guarantees (measured in docs/guides/reliability.md):
- A directory named ``step_N`` is always whole. It appears only by renaming a finished ``tmp_step_N``, and
  one being replaced or pruned is first renamed to a ``tmp_`` name, so a kill at any instant leaves whole
  ``step_N`` directories plus ``tmp_*`` leftovers, which are ignored and removed by the next save.
- Nothing non-finite is written: ``save`` refuses before touching the disk.
- A storage error (unwritable directory, full disk) raises CheckpointError on every rank, removes the partial
  ``tmp_step_N`` and leaves the earlier checkpoints as they were.
- ``load`` checks the manifest first: a missing, truncated or garbled file raises CheckpointError naming it.
- Nothing in a checkpoint is unpickled beyond tensors and plain data: ``trainer.pt`` and the weights'
  non-tensor entries go through torch's restricted unpickler, and DCP's ``.metadata`` (which DCP reads with
  plain pickle) must first pass an unpickler that knows only DCP's own metadata classes. A file naming
  anything else (a callable, another class) is refused with CheckpointError before any of it runs.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import re
import shutil
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
import yaml
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.tensor import DTensor

from dtppo.distributed.comm import all_reduce, broadcast, is_distributed, rank
from dtppo.errors import CheckpointError
from dtppo.faults import pause_in_checkpoint
from dtppo.files import discard_dir, replace_dir

_STEP_DIR = re.compile(r"^step_(\d+)$")
_UNSUPPORTED = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")
WEIGHTS_DIR = "weights"
TRAINER_FILE = "trainer.pt"
_DCP_METADATA = ".metadata"
CONFIG_FILE = "config.yaml"
HF_DIR = "hf"
MANIFEST_FILE = "manifest.json"
_CHUNK = 8 << 20


def rng_state() -> dict[str, Any]:
    """The process's RNG states as tensors and plain data (what ``torch.load(weights_only=True)`` reads)."""
    _, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    numpy_state = {
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": numpy_state}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )


# ---------------------------------------------------------------------------------------------- save


def save(
    checkpoint_dir: str | Path,
    step: int,
    sharded: dict[str, Any],
    replicated: dict[str, Any],
    config: dict[str, Any],
    keep_last: int,
    hf_files: dict[str, bytes] | None = None,
) -> Path:
    """Collective: every rank writes its shards of ``sharded``; rank 0 writes the rest and commits.

    ``hf_files``: {path relative to ``hf/``: bytes}, rank 0's (``models.description.describe_models``).

    Raises CheckpointError on every rank when the state holds a non-finite value or the storage refuses a
    write; no ``step_N`` appears then and earlier checkpoints are untouched.
    """
    root = Path(checkpoint_dir)
    final, tmp = root / f"step_{step}", root / f"tmp_step_{step}"
    _refuse_nonfinite(sharded, final)
    _agreed(lambda: _prepare(root, tmp), final)
    pause_in_checkpoint()
    try:
        dcp.save(sharded, checkpoint_id=str(tmp / WEIGHTS_DIR))
    except (OSError, RuntimeError, CheckpointException) as err:  # dcp raises the same on every rank
        if rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(_write_failure(final, WEIGHTS_DIR, err)) from None
    pause_in_checkpoint()
    _agreed(lambda: _commit(root, tmp, final, replicated, config, keep_last, hf_files or {}), final)
    return final


def _refuse_nonfinite(sharded: dict[str, Any], final: Path) -> None:
    """Collective: raise on every rank if any rank's floating-point state holds NaN or inf."""
    bad = next((name for name, t in _tensors(sharded) if t.is_floating_point() and not torch.isfinite(t).all()), None)
    if bool(all_reduce(_flag(bad is not None), "max") > 0):
        where = f"{bad} holds NaN/inf" if bad is not None else "another rank's state holds NaN/inf"
        raise CheckpointError(f"refusing to write {final}: {where}; earlier checkpoints are untouched")


def _tensors(tree: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """(dotted name, this rank's local tensor) for every tensor in a nested state dict."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from _tensors(value, f"{prefix}.{i}")
    elif isinstance(tree, DTensor):
        yield prefix, tree.to_local()
    elif isinstance(tree, torch.Tensor):
        yield prefix, tree


def _agreed(rank0_work: Callable[[], None], final: Path) -> None:
    """Run ``rank0_work`` on rank 0 and make every rank agree on its outcome, so a storage error there
    raises everywhere instead of leaving the other ranks waiting in the next collective."""
    message = ""
    if rank() == 0:
        try:
            rank0_work()
        except (OSError, RuntimeError) as err:
            shutil.rmtree(final.parent / f"tmp_{final.name}", ignore_errors=True)
            message = _write_failure(final, "", err)
    if bool(broadcast(_flag(bool(message))) > 0):
        raise CheckpointError(message or f"rank 0 could not write {final} (its error says why)")


def _flag(value: bool) -> torch.Tensor:
    """A 0/1 tensor where this rank's collectives run (nccl needs it on the current GPU)."""
    on_gpu = is_distributed() and torch.distributed.get_backend() == "nccl"
    return torch.tensor(float(value), device=torch.cuda.current_device() if on_gpu else "cpu")


def _prepare(root: Path, tmp: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob("tmp_*"):
        shutil.rmtree(leftover, ignore_errors=True)
    tmp.mkdir()


def _commit(
    root: Path,
    tmp: Path,
    final: Path,
    replicated: dict[str, Any],
    config: dict[str, Any],
    keep_last: int,
    hf_files: dict[str, bytes],
) -> None:
    """Rank 0: the replicated state and the manifest, then the rename that makes ``step_N`` exist."""
    buffer = io.BytesIO()  # serialised in memory so a failing disk reports a plain OSError (errno, path)
    torch.save(replicated, buffer)
    _write_bytes(tmp / TRAINER_FILE, buffer.getvalue())
    _write_bytes(tmp / CONFIG_FILE, yaml.safe_dump(config, sort_keys=False).encode())
    for name, data in hf_files.items():
        (tmp / HF_DIR / name).parent.mkdir(parents=True, exist_ok=True)
        _write_bytes(tmp / HF_DIR / name, data)
    pause_in_checkpoint()
    manifest = {"files": {str(p.relative_to(tmp)): _digest(p) for p in sorted(tmp.rglob("*")) if p.is_file()}}
    _write_bytes(tmp / MANIFEST_FILE, json.dumps(manifest, indent=1).encode())
    _fsync_tree(tmp)
    pause_in_checkpoint()
    replace_dir(tmp, final)
    _fsync_tree(root, recurse=False)
    for old in complete_steps(root)[:-keep_last]:
        try:
            discard_dir(root / f"step_{old}")
        except OSError as err:  # the new checkpoint is whole; a failed prune only costs disk
            print(f"warning: could not remove old checkpoint {root / f'step_{old}'}: {err}", flush=True)


def _write_bytes(path: Path, data: bytes) -> None:
    with path.open("wb") as fh:
        fh.write(data)


def _write_failure(final: Path, part: str, err: BaseException) -> str:
    """One line: what could not be written, the root cause, free space, and what is still intact."""
    cause = err
    if isinstance(err, CheckpointException) and err.failures:
        cause = next(iter(err.failures.values()))[0]
    detail = f"{type(cause).__name__}: {cause}".strip().splitlines()[-1]
    if "unexpected pos" in detail:  # torch.save's own writer hides the OSError behind a position mismatch
        detail = f"short write, the device is full or refuses the file size ({detail})"
    try:
        free = f"; {shutil.disk_usage(final.parent).free >> 20} MiB free there"
    except OSError:
        free = ""
    try:
        previous = complete_steps(final.parent)
        kept = f"step_{previous[-1]} is intact" if previous else "no earlier checkpoint exists"
    except OSError:
        kept = "earlier checkpoints were not touched"
    return f"cannot write checkpoint {final}{f' ({part})' if part else ''}: {detail}{free}; {kept}"


# ---------------------------------------------------------------------------------------------- find, load


def complete_steps(checkpoint_dir: str | Path) -> list[int]:
    """Steps with a checkpoint, ascending. A ``step_N`` directory is complete by construction (see above);
    damage done to it later is reported by ``load``, not hidden by skipping it."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir())


def is_step_dir(path: str | Path) -> bool:
    return bool(_STEP_DIR.match(Path(path).name)) and Path(path).is_dir()


def latest_step(checkpoint_dir: str | Path) -> int | None:
    steps = complete_steps(checkpoint_dir)
    return steps[-1] if steps else None


def load(path: str | Path, sharded: dict[str, Any], local: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fill ``sharded`` (a state dict of the current layout) in place from ``path``; return the replicated
    state and the config mapping. Any subset of the saved keys may be requested. Every file is checked
    against the manifest first; damage raises CheckpointError naming the file. ``local``: whole tensors read by
    this process alone, not a collective over the ranks."""
    path = Path(path)
    try:
        verify(path)
    except CheckpointError as err:
        raise CheckpointError(f"{err}{_earlier_hint(path)}") from None
    _check_metadata(path / WEIGHTS_DIR / _DCP_METADATA)
    try:
        dcp.load(sharded, checkpoint_id=str(path / WEIGHTS_DIR), planner=_RestrictedLoadPlanner(), no_dist=local)
    except CheckpointException as err:
        cause = next(iter(err.failures.values()), None) if err.failures else None
        if isinstance(cause, tuple) and isinstance(cause[0], pickle.UnpicklingError):
            raise CheckpointError(_refusal(path / WEIGHTS_DIR, cause[0])) from None
        raise CheckpointError(f"cannot load {path / WEIGHTS_DIR}: {_first_line(err)}") from None
    except pickle.UnpicklingError as err:
        raise CheckpointError(_refusal(path / WEIGHTS_DIR, err)) from None
    except (OSError, RuntimeError, ValueError, KeyError) as err:
        raise CheckpointError(f"cannot load {path / WEIGHTS_DIR}: {_first_line(err)}") from None
    return _upgrade(_load_replicated(path / TRAINER_FILE)), read_config(path)


def _upgrade(replicated: dict[str, Any]) -> dict[str, Any]:
    """The replicated state in today's layout. Checkpoints written before 2026-12-07 kept the loader's position
    beside the rollouts' state (``loader``), not in it with the step it is for."""
    if "loader" in replicated:
        rollouts = dict(replicated.pop("rollouts", None) or {})
        replicated["rollouts"] = rollouts | {"loader": replicated.pop("loader"), "step": int(replicated["steps_done"])}
    return replicated


def _load_replicated(file: Path) -> dict[str, Any]:
    """``trainer.pt`` through torch's restricted unpickler: tensors and plain containers only. Anything else
    (a class, a function call) is refused before it is built, so a crafted file cannot run code."""
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise CheckpointError(_refusal(file, err)) from None
    except Exception as err:  # a damaged archive can raise almost anything
        raise CheckpointError(f"cannot load {file}: {_first_line(err)}") from None


def _refusal(file: Path, err: pickle.UnpicklingError) -> str:
    culprit = _UNSUPPORTED.search(str(err))
    what = f"it names {culprit.group(1)}" if culprit else _first_line(err)
    return f"refusing to load {file}: it holds more than tensors and plain data ({what})"


class _RestrictedLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, except that a non-tensor entry (optimizer hyper-parameters) must pass torch's
    restricted unpickler before DCP reads it (DCP itself reads those entries with plain pickle)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        torch.load(io.BytesIO(value.getvalue()), weights_only=True)
        value.seek(0)
        super().load_bytes(read_item, value)


# What torch.distributed.checkpoint's metadata file names (its own dataclasses, sizes, dtypes, layouts, paths):
# constructors without side effects. Anything else in it is refused before DCP unpickles the file.
_METADATA_GLOBALS = {
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
}
_METADATA_GLOBALS |= {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    )
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if dtype or (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {module}.{name}")


def _check_metadata(file: Path) -> None:
    """Raise CheckpointError unless ``file`` (DCP's pickled metadata) names only ``_METADATA_GLOBALS``."""
    try:
        with file.open("rb") as fh:
            _MetadataUnpickler(fh).load()
    except pickle.UnpicklingError as err:
        raise CheckpointError(_refusal(file, err)) from None
    except Exception as err:  # a damaged file can raise almost anything
        raise CheckpointError(f"cannot load {file}: {_first_line(err)}") from None


def _earlier_hint(path: Path) -> str:
    """Point at the newest earlier checkpoint, if any: resuming from it is the user's call, not ours."""
    match = _STEP_DIR.match(path.name)
    earlier = [s for s in complete_steps(path.parent) if match and s < int(match.group(1))]
    return f"; step_{earlier[-1]} is also there: move {path.name} aside to resume from it" if earlier else ""


def read_config(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    verify(path, only=CONFIG_FILE)
    return yaml.safe_load((path / CONFIG_FILE).read_text())


def verify(path: str | Path, only: str | None = None) -> None:
    """Check the files of checkpoint ``path`` (or just ``only``) against its manifest: present, the recorded
    size (a short file is truncated) and CRC32 (a changed byte is garbled). Raises CheckpointError."""
    path = Path(path)
    manifest_path = path / MANIFEST_FILE
    try:
        files = json.loads(manifest_path.read_text())["files"]
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} is incomplete: {manifest_path} is missing") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path} is corrupted: {manifest_path} is unreadable ({err})") from None
    for name, expected in files.items():
        if only is not None and name != only:
            continue
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete: {file} is missing")
        size, crc = _digest(file)
        if size != expected[0]:
            raise CheckpointError(
                f"checkpoint {path} is corrupted: {file} has {size} bytes, expected {expected[0]} "
                f"(truncated or overwritten)"
            )
        if crc != expected[1]:
            raise CheckpointError(f"checkpoint {path} is corrupted: {file} fails its CRC32 check (garbled)")


def _digest(path: Path) -> tuple[int, int]:
    """(size, CRC32): CRC32 catches truncation and random corruption at several GB/s; this is an integrity
    check against crashes and bad disks, not against deliberate tampering."""
    crc, size = 0, 0
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            crc, size = zlib.crc32(chunk, crc), size + len(chunk)
    return size, crc


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[-1] if text else ''}"


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
