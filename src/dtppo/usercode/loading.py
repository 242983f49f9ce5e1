"""Loading the user's code a spec names (``path/to/file.py:Name`` or ``package.module:Name``): reward functions and
environment classes. Light on purpose: scoring and environment processes import it."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dtppo.config.reward_spec import FunctionSpec
from dtppo.errors import InputError


def load_callable(parsed: FunctionSpec, what: str, error: type[InputError]) -> Callable[..., Any]:
    """The callable a file or module spec names (a reward function, an environment class); ``what`` names it in
    the ``error`` raised for a missing file or module, one that fails to import, a missing or uncallable name."""
    module = _load_file(parsed, what, error) if parsed.kind == "file" else _import(parsed, what, error)
    if not hasattr(module, parsed.attribute):
        raise error(f"{what} {parsed.text!r}: {parsed.target} has no {parsed.attribute!r}")
    fn = getattr(module, parsed.attribute)
    if not callable(fn):
        raise error(f"{what} {parsed.text!r}: {parsed.attribute} is a {type(fn).__name__}, not callable")
    return fn


def _load_file(parsed: FunctionSpec, what: str, error: type[InputError]) -> Any:
    path = Path(parsed.target).resolve()
    if not path.is_file():
        raise error(f"{what} {parsed.text!r}: file not found: {parsed.target}")
    # One module per file, registered so the file's own dataclasses and pickling see their module.
    name = f"dtppo_user_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except Exception as err:  # the user's file: any failure is reported as that file's, in one line
        del sys.modules[name]
        raise error(f"{what} {parsed.text!r}: importing {parsed.target} raised {type(err).__name__}: {err}") from err
    return module


def _import(parsed: FunctionSpec, what: str, error: type[InputError]) -> Any:
    try:
        return importlib.import_module(parsed.target)
    except Exception as err:  # ModuleNotFoundError, or whatever the module raises while it loads
        raise error(f"{what} {parsed.text!r}: cannot import {parsed.target}: {type(err).__name__}: {err}") from err
