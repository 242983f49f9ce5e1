"""Recipes to Config: YAML with a ``defaults:`` parent chain, ``section.key=value`` overrides, typed conversion.

A recipe may name one parent with ``defaults: other.yaml`` (resolved relative to the recipe); its keys are
merged over the parent's. Command-line overrides are parsed as YAML scalars and merged last. The merged mapping is
then converted into the dataclass tree: unknown keys, wrong types and each section's own rules fail with the full
dotted key path, and the rules spanning sections (``checks``) are checked once here so no later code re-validates.
Keys written under an older name (``renames``) are moved to their new place with a one-line notice.
This validates the recipe by itself: the files, models, packages and code it names are ``dtppo.launch.preflight``'s.
"""

from __future__ import annotations

import copy
import dataclasses
import keyword
import math
import re
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from dtppo.config.checks import check, warn_unusual
from dtppo.config.renames import migrate, renamed_key
from dtppo.config.rules import ConfigError
from dtppo.config.schema import Config

_YAML11_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def load(recipe: str | Path | Mapping[str, Any], overrides: Sequence[str] = ()) -> Config:
    """Read a recipe (a file, with its ``defaults:`` chain, or a mapping of the same form, whose ``defaults:`` is
    resolved from the working directory), apply ``key=value`` overrides, validate, freeze."""
    if isinstance(recipe, Mapping):
        tree = _recipe_tree(copy.deepcopy(dict(recipe)), Path.cwd() / "<mapping>", seen=())
    else:
        tree = _read_recipe(Path(recipe), seen=())
    tree = apply_overrides(tree, overrides)
    cfg = _build(Config, tree, path="")
    check(cfg)
    warn_unusual(cfg)
    return cfg


def apply_overrides(tree: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``tree`` with each ``section.key=value`` set in it (values parsed as YAML scalars), in place."""
    if isinstance(overrides, str):  # a lone override would be read character by character
        raise ConfigError(f"overrides: expected a list of section.key=value, got the string {overrides!r}")
    for item in overrides:
        if not isinstance(item, str):
            raise ConfigError(f"overrides: {item!r} is not a section.key=value string")
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{item}: overrides are written section.key=value")
        key = key.strip()
        if renamed_key(key) != key:
            print(
                f"config: {key} is now {renamed_key(key)}; the override applies, but write {renamed_key(key)}",
                file=sys.stderr,
            )
        _set_dotted(tree, renamed_key(key), yaml.safe_load(raw) if raw.strip() else None)
    return tree


def from_dict(tree: dict[str, Any]) -> Config:
    """Build and validate a config from an already merged mapping (e.g. one saved in a checkpoint, whose keys may
    be older names: they are moved silently)."""
    cfg = _build(Config, migrate(tree, notice=False), path="")
    check(cfg)
    return cfg


def _read_recipe(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"recipe: file not found: {path}")
    if path.resolve() in seen:
        raise ConfigError(f"defaults: inheritance cycle through {path}")
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"recipe: {path} is not valid YAML: {err}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"recipe: {path} must hold a mapping at the top level")
    return _recipe_tree(tree, path, seen)


def _recipe_tree(tree: dict[str, Any], path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    """A recipe's mapping (read from ``path``) merged over its ``defaults:`` parent's."""
    migrate(tree)
    parent = tree.pop("defaults", None)
    if parent is None:
        return tree
    if not isinstance(parent, str) or not (path.parent / parent).is_file():
        raise ConfigError(f"defaults: recipe file not found: {parent!r} (named in {path})")
    base = _read_recipe(path.parent / parent, seen + (path.resolve(),))
    return _merge(base, tree)


def _merge(base: dict[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in delta.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for name in parents:
        child = node.setdefault(name, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {name} is not a section")
        node = child
    node[leaf] = value


def _build(cls: type, tree: Any, path: str) -> Any:
    if tree is None:
        tree = {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{path or 'config'}: expected a section (mapping), got {tree!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    # A key that is a Python keyword (env.class) is the field with a trailing underscore (PEP 8's convention).
    tree = {f"{k}_" if keyword.iskeyword(k) and f"{k}_" in names else k: v for k, v in tree.items()}
    unknown = sorted(set(tree) - names)
    if unknown:
        raise ConfigError(f"{_join(path, unknown[0])}: unknown key")
    kwargs = {name: _coerce(hints[name], value, _join(path, name)) for name, value in tree.items()}
    try:
        return cls(**kwargs)
    except ConfigError as err:  # the section's own rule, naming its field: prefix where the section sits
        raise ConfigError(_join(path, str(err))) from None


def _coerce(hint: Any, value: Any, path: str) -> Any:
    if hint == KWARGS:
        return _kwargs(value, path)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, path)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, path)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path}: must be one of {list(args)}, got {value!r}")
        return value
    if origin is tuple and args[-1:] == (Ellipsis,):
        if args[0] is str and isinstance(value, str):
            value = [value]  # a list of names given as one name (``target_modules: all-linear``)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        return tuple(_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{path}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if hint is float:
        if isinstance(value, str) and _YAML11_FLOAT.fullmatch(value.strip()):
            value = float(value)  # PyYAML reads "3e-4" (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if hint is bool or hint is str:
        if not isinstance(value, hint):
            raise ConfigError(f"{path}: expected {hint.__name__}, got {value!r}")
        return value
    raise AssertionError(f"unsupported config type {hint} at {path}")


KWARGS = tuple[tuple[str, Any], ...]
_PLAIN = (str, int, float, bool, type(None))


def _kwargs(value: Any, path: str) -> tuple[tuple[str, Any], ...]:
    """Keyword arguments for user code, frozen: a mapping (or the [key, value] pairs ``Config.to_dict`` writes) of
    names to numbers, strings, booleans, null or lists of them (lists become tuples)."""
    pairs = value.items() if isinstance(value, dict) else value
    if not isinstance(pairs, (list, tuple, type({}.items()))) or not all(
        isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs
    ):
        raise ConfigError(f"{path}: expected a mapping of names to values, got {value!r}")
    frozen = []
    for name, item in pairs:
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"{path}: {name!r} is not a keyword argument name")
        if isinstance(item, (list, tuple)) and all(isinstance(v, _PLAIN) for v in item):
            item = tuple(item)
        elif not isinstance(item, _PLAIN):
            raise ConfigError(f"{path}.{name}: expected a number, string, boolean, null or a list of them")
        frozen.append((name, item))
    return tuple(sorted(frozen))


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
