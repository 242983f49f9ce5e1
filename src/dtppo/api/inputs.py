"""What ``PPOTrainer``'s arguments become: the reward functions as names in ``reward.functions`` beside the callables
(``GivenInputs``), the datasets as the rows that replace ``data.train`` / ``data.validation``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dtppo import config as config_lib
from dtppo.config import Config, ConfigError
from dtppo.config.reward_spec import BUILTINS, RESERVED_NAMES
from dtppo.usercode.given import GivenInputs

RewardFuncs = Callable[..., Any] | str | Sequence[Callable[..., Any] | str] | Mapping[str, Callable[..., Any]]


def given_inputs(
    config: Config, reward_funcs: RewardFuncs | None, train_dataset: Any, eval_dataset: Any
) -> tuple[Config, GivenInputs]:
    """``config`` with ``reward.functions`` (and, where their number changed, ``reward.weights``: 1 each, TRL's
    default) naming ``reward_funcs``, and what the names and the datasets stand for."""
    functions: tuple[tuple[str, Callable[..., Any]], ...] = ()
    if reward_funcs is not None:
        specs, functions = _named(reward_funcs)
        tree = config.to_dict()
        reward = tree.setdefault("reward", {})
        if len(reward.get("weights") or ()) != len(specs):
            reward["weights"] = [1.0] * len(specs)
        reward["functions"] = specs
        config = config_lib.from_dict(tree)
    rows = (_rows("train_dataset", train_dataset), _rows("eval_dataset", eval_dataset))
    return config, GivenInputs(functions, *rows)


def _named(reward_funcs: RewardFuncs) -> tuple[list[str], tuple[tuple[str, Callable[..., Any]], ...]]:
    """(the specs ``reward.functions`` takes, (name, callable) of the callables among them). A callable is named by
    the mapping's key, else by its ``__name__`` (a lambda's, not an identifier: ``reward_<i>``); a string is a spec
    (a built-in, ``path/to/file.py:name``, ``package.module:name``)."""
    if isinstance(reward_funcs, Mapping):
        items = list(reward_funcs.items())
    else:
        single = callable(reward_funcs) or isinstance(reward_funcs, str)
        items = [(None, fn) for fn in ([reward_funcs] if single else reward_funcs)]
    specs, functions = [], []
    for i, (name, fn) in enumerate(items):
        if isinstance(fn, str):
            specs.append(fn)
            continue
        if not callable(fn):
            raise ConfigError(f"reward_funcs[{i}]: {fn!r} is neither a callable nor a reward function's spec")
        if name is None:
            name = getattr(fn, "__name__", "")
            name = name if name.isidentifier() else f"reward_{i}"
            name = name if name not in specs else f"{name}_{i}"
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"reward_funcs: {name!r} is not a Python name (it becomes train/reward/<name>)")
        if name in BUILTINS or name in RESERVED_NAMES or name in specs:
            raise ConfigError(
                f"reward_funcs[{i}]: the name {name!r} is taken (a built-in, a metric dtppo logs or another "
                "function): pass a mapping {name: function} to name it"
            )
        specs.append(name)
        functions.append((name, fn))
    return specs, tuple(functions)


def _rows(argument: str, dataset: Any) -> Iterable[Mapping] | None:
    """A ``datasets.Dataset`` as it is (its rows are read where the run reads data), a list of dicts; else one
    ``ConfigError`` naming the argument."""
    if dataset is None:
        return None
    if hasattr(dataset, "column_names") and not isinstance(dataset.column_names, list):
        raise ConfigError(f"{argument}: a DatasetDict holds several splits: pass one, e.g. dataset['train']")
    if hasattr(dataset, "column_names"):
        return dataset
    if isinstance(dataset, (list, tuple)) and all(isinstance(row, Mapping) for row in dataset):
        if not dataset:
            raise ConfigError(f"{argument}: no rows")
        return [dict(row) for row in dataset]
    raise ConfigError(f"{argument}: expected a datasets.Dataset or a list of dicts, got {type(dataset).__name__}")
