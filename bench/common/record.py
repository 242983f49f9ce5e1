"""How every record under bench/results is written, so that it says what made it.

``write_record`` puts a ``provenance`` block first in the record: the command that reproduces it as run from the
repository root (``python -m bench.<kind>.<name> ARGS``, with the CPU-kernel variables it ran under), the commit
(``git rev-parse HEAD``), whether the tree differed from that commit (``dirty``: tracked or untracked changes outside
bench/results/ and runs/, which hold outputs, not code) and the UTC time. Without git (a tarball) the commit is null
and ``commit_source`` says why; nothing here raises for want of git. The file is written whole then renamed, and
absolute paths are written relative to the repository (temporary ones as ``$TMPDIR``, the home directory as ``~``),
so that no record names the machine it ran on.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from bench.common.paths import REPO
from dtppo.files import write_file

# torch's and oneDNN's kernel choice changes the figures (docs/design/numerics.md): a command reproduces them only
# with these.
KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
# Outputs of the benches themselves: a record written earlier in a session does not make the next one's code dirty.
OUTPUTS = ("bench/results", "runs")


def _roots() -> list[tuple[str, str]]:
    """(absolute prefix, what it is written as), longest first so that the repository wins over a folder above it."""
    home = os.path.expanduser("~")  # "~" itself where the home directory is unknown: nothing to replace
    roots = {str(REPO): ".", os.path.realpath(REPO): ".", tempfile.gettempdir(): "$TMPDIR", home: "~"}
    return sorted(((k.rstrip("/"), v) for k, v in roots.items() if k.rstrip("/")), key=lambda kv: -len(kv[0]))


_SHORT = dict(_roots())
# A root where a path starts (not inside another path) and ends (a separator or no more path characters).
_PATH = re.compile(r"(?<![\w.~/$-])(" + "|".join(map(re.escape, _SHORT)) + r")(/|(?![\w.-]))")


def _replace(match: re.Match) -> str:
    short = _SHORT[match.group(1)]
    if match.group(2) != "/":
        return short
    return "" if short == "." else short + "/"


def relative(value):
    """``value`` (strings, and lists and dicts of them, keys included) with absolute paths written as the module
    docstring says; anything else unchanged."""
    if isinstance(value, str):
        return _PATH.sub(_replace, value)
    if isinstance(value, dict):
        return {relative(k): relative(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [relative(v) for v in value]
    return value


def kernels_prefix() -> str:
    """The CPU-kernel variables this process was started with, as a command's prefix (empty on the default)."""
    return "".join(f"{name}={os.environ[name]} " for name in KERNEL_VARIABLES if name in os.environ)


def command_line(module: str | None = None, args: list[str] | None = None) -> str:
    """The command that ran this process, from the repository root: ``python -m MODULE ARGS`` (by default the
    module ``-m`` ran, else ``python SCRIPT``, and ``sys.argv[1:]``), quoted for a shell, paths relative."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    module = module or (spec.name.removesuffix(".__main__") if spec else None)
    head = ["python", "-m", module] if module else ["python", sys.argv[0]]
    # Quoted first, then made relative: $TMPDIR and ~ stay unquoted, so that a shell expands them.
    return kernels_prefix() + relative(shlex.join([*head, *(sys.argv[1:] if args is None else args)]))


def _git(*args: str) -> tuple[str | None, str]:
    """git's output in the repository, or None and why not (no git, no repository, an error)."""
    try:
        proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        return None, f"git did not run ({type(error).__name__}: {error})"
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return None, lines[0] if lines else f"git {args[0]} exited {proc.returncode}"
    return proc.stdout.strip(), ""


def provenance(command: str | None = None) -> dict:
    """The provenance block of a record written now by ``command`` (default: :func:`command_line`)."""
    head, why = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--", ".", *(f":(exclude){path}" for path in OUTPUTS))[0] if head else None
    return {
        "command": command or command_line(),
        "commit": head,
        "commit_source": "git rev-parse HEAD when the record was written" if head else f"no git history: {why}",
        "dirty": None if status is None else bool(status),
        "utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def write_json(path: Path | str, record: dict, indent: int = 1) -> None:
    """``record`` (paths relative) to ``path``, atomically (``dtppo.files.write_file``): a process killed mid-write
    leaves the previous complete file, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, json.dumps(relative(record), indent=indent) + "\n")


def write_record(path: Path | str, payload: dict, command: str | None = None, indent: int = 1) -> dict:
    """``payload`` under a fresh provenance block (one read back from an earlier record is replaced), written by
    :func:`write_json`; returns what was written."""
    record = {"provenance": provenance(command)} | {k: v for k, v in payload.items() if k != "provenance"}
    write_json(path, record, indent)
    return relative(record)
