"""Typed, frozen configuration tree loaded from YAML recipes.

A recipe may name one parent with ``defaults: other.yaml`` (resolved relative to the recipe); its keys are
merged over the parent's. Command-line overrides ``section.key=value`` are parsed as YAML scalars and merged
last. The merged mapping is then converted into the dataclass tree below: unknown keys and wrong types fail
with the full dotted key path, and cross-field rules are checked once here so no later code re-validates.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


_YAML11_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


class ConfigError(ValueError):
    """A recipe or override is invalid; the message names the dotted key."""


# ---------------------------------------------------------------------------------------------- schema


@dataclass(frozen=True, kw_only=True)
class TinyModelConfig:
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 512


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    path: str | None = None
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    lr: float = 1e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    kind: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    total_steps: int = 0


@dataclass(frozen=True, kw_only=True)
class GenerationConfig:
    max_new_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    val_greedy: bool = True
    backend: Literal["torch", "vllm"] = "torch"
    """Who samples rollouts and validation answers: ``torch`` (dtppo's KV-cache sampler on the rank's replica)
    or ``vllm`` (one in-process vLLM engine per policy rank, refit in place after each update; needs vLLM
    installed: ``make venv`` puts the CPU build in .venv, README names the GPU wheel)."""
    vllm_kv_cache_mib: int = 256
    """KV-cache memory of each rank's vLLM engine, in MiB (vLLM's ``kv_cache_memory_bytes``)."""


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    tp: int = 1
    sequence_parallel: bool = False
    unsharded_grad_accumulation: bool = True
    dp_replicate: int = 1


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    train_global_batch_size: int = 32
    train_micro_batch_size: int = 32
    logprob_batch_size: int = 64
    max_grad_norm: float = 1.0
    sequence_packing: bool = True


@dataclass(frozen=True, kw_only=True)
class ValueConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=1e-3))
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    train_global_batch_size: int = 32
    train_micro_batch_size: int = 32
    inference_batch_size: int = 64
    max_grad_norm: float = 1.0
    head_init_std: float = 0.02
    shift_values: bool = True
    sequence_packing: bool = True


@dataclass(frozen=True, kw_only=True)
class PPOConfig:
    seed: int = 0
    max_num_steps: int = 50
    num_prompts_per_step: int = 64
    num_generations_per_prompt: int = 1
    ppo_epochs: int = 1
    policy_training_start_step: int = 0
    gamma: float = 1.0
    lambda_value: float = 1.0
    lambda_policy: float = 1.0
    length_adaptive_alpha: float = 0.0
    normalize_advantages: bool = True
    val_period: int = 10
    val_at_start: bool = True
    max_val_samples: int = 256
    val_batch_size: int = 256
    init_from_sft: bool = False
    max_consecutive_nonfinite_steps: int = 3


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    ratio_clip_low: float = 0.2
    ratio_clip_high: float = 0.2
    ratio_clip_c: float | None = None
    kl_coef: float = 0.0
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    kl_in_reward: bool = False
    value_clip: float | None = 0.5
    value_loss_scale: float = 1.0


@dataclass(frozen=True, kw_only=True)
class TinyMathConfig:
    max_number: int = 20
    min_ops: int = 1
    max_ops: int = 2
    validation_seed: int = 12345


@dataclass(frozen=True, kw_only=True)
class DatasetConfig:
    path: str | None = None


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    task: Literal["gsm8k", "tiny_math"] = "tiny_math"
    train: DatasetConfig = field(default_factory=DatasetConfig)
    validation: DatasetConfig = field(default_factory=DatasetConfig)
    tiny_math: TinyMathConfig = field(default_factory=TinyMathConfig)
    system_prompt: str | None = None
    max_prompt_tokens: int = 256
    on_bad_row: Literal["skip", "error"] = "skip"


@dataclass(frozen=True, kw_only=True)
class CarelessStageConfig:
    num_steps: int = 0
    lr: float = 3e-4
    careless_fraction: float = 0.6


@dataclass(frozen=True, kw_only=True)
class SFTConfig:
    output_dir: str = "runs/sft"
    num_steps: int = 500
    batch_size: int = 32
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=3e-3))
    scheduler: SchedulerConfig = field(
        default_factory=lambda: SchedulerConfig(kind="cosine", warmup_steps=30)
    )
    max_grad_norm: float = 1.0
    careless_stage: CarelessStageConfig = field(default_factory=CarelessStageConfig)
    log_period: int = 50


@dataclass(frozen=True, kw_only=True)
class RewardConfig:
    num_workers: int = 2
    timeout_s: float = 30.0


@dataclass(frozen=True, kw_only=True)
class LoggerConfig:
    log_dir: str = "runs/ppo"
    tensorboard: bool = True
    progress: bool = True


@dataclass(frozen=True, kw_only=True)
class CheckpointingConfig:
    enabled: bool = True
    checkpoint_dir: str = "runs/ppo/checkpoints"
    save_period: int = 10
    keep_last: int = 2


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    num_nodes: int = 1
    workers_per_node: int = 1
    backend: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    ray_placement: Literal["pack", "spread"] = "pack"
    ray_temp_dir: str = "/tmp/dtppo-ray"
    ray_timeout_s: float = 120.0
    # 0: policy and critic colocated on every rank. N: policy on ranks [0, N), critic on the other ranks,
    # so the two updates run at the same time on different devices.
    policy_ranks: int = 0

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.workers_per_node

    @property
    def colocated(self) -> bool:
        return self.policy_ranks == 0

    def pool(self, role: Literal["policy", "value"]) -> range:
        """The ranks that hold ``role``'s model."""
        if self.colocated:
            return range(self.world_size)
        return range(self.policy_ranks) if role == "policy" else range(self.policy_ranks, self.world_size)


@dataclass(frozen=True, kw_only=True)
class Config:
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    value: ValueConfig = field(default_factory=ValueConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpointing: CheckpointingConfig = field(default_factory=CheckpointingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    @property
    def samples_per_step(self) -> int:
        return self.ppo.num_prompts_per_step * self.ppo.num_generations_per_prompt

    @property
    def policy_init_path(self) -> str | None:
        """Where the policy's weights come from: the SFT output when PPO starts from SFT."""
        return self.sft.output_dir if self.ppo.init_from_sft else self.policy.model.path

    @property
    def value_init_path(self) -> str | None:
        """The critic's backbone: its own path if set, else the policy's starting point (or a tiny random model)."""
        return self.value.model.path or self.policy_init_path

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(dataclasses.asdict(self))


# ---------------------------------------------------------------------------------------------- loading


def load(recipe: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a recipe (with its ``defaults:`` chain), apply ``key=value`` overrides, validate, freeze."""
    tree = _read_recipe(Path(recipe), seen=())
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{item}: overrides are written section.key=value")
        _set_dotted(tree, key.strip(), yaml.safe_load(raw) if raw.strip() else None)
    cfg = _build(Config, tree, path="")
    _check(cfg)
    _check_inputs_exist(cfg)
    return cfg


def from_dict(tree: dict[str, Any]) -> Config:
    """Build and validate a config from an already merged mapping (e.g. one saved in a checkpoint)."""
    cfg = _build(Config, tree, path="")
    _check(cfg)
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
    unknown = sorted(set(tree) - names)
    if unknown:
        raise ConfigError(f"{_join(path, unknown[0])}: unknown key")
    kwargs = {name: _coerce(hints[name], value, _join(path, name)) for name, value in tree.items()}
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, path: str) -> Any:
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


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _to_plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_to_plain(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------- checks


def _require(ok: bool, key: str, problem: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {problem}")


def _check(cfg: Config) -> None:
    """Cross-field and range rules, checked once at load."""
    ppo, loss = cfg.ppo, cfg.loss
    for key, value in [
        ("ppo.max_num_steps", ppo.max_num_steps),
        ("ppo.num_prompts_per_step", ppo.num_prompts_per_step),
        ("ppo.num_generations_per_prompt", ppo.num_generations_per_prompt),
        ("ppo.ppo_epochs", ppo.ppo_epochs),
        ("ppo.val_period", ppo.val_period),
        ("ppo.max_val_samples", ppo.max_val_samples),
        ("ppo.val_batch_size", ppo.val_batch_size),
        ("policy.generation.max_new_tokens", cfg.policy.generation.max_new_tokens),
        ("policy.logprob_batch_size", cfg.policy.logprob_batch_size),
        ("value.inference_batch_size", cfg.value.inference_batch_size),
        ("checkpointing.save_period", cfg.checkpointing.save_period),
        ("checkpointing.keep_last", cfg.checkpointing.keep_last),
        ("sft.batch_size", cfg.sft.batch_size),
        ("data.max_prompt_tokens", cfg.data.max_prompt_tokens),
        ("cluster.num_nodes", cfg.cluster.num_nodes),
        ("cluster.workers_per_node", cfg.cluster.workers_per_node),
    ]:
        _require(value >= 1, key, f"must be >= 1, got {value}")
    _require(ppo.policy_training_start_step >= 0, "ppo.policy_training_start_step", "must be >= 0")
    _require(ppo.max_consecutive_nonfinite_steps >= 0, "ppo.max_consecutive_nonfinite_steps",
             "must be >= 0 (0 = never stop, only skip)")
    _require(0.0 <= ppo.gamma <= 1.0, "ppo.gamma", f"must be in [0, 1], got {ppo.gamma}")
    for key, lam in [("ppo.lambda_value", ppo.lambda_value), ("ppo.lambda_policy", ppo.lambda_policy)]:
        _require(0.0 <= lam <= 1.0, key, f"must be in [0, 1], got {lam}")
    _require(ppo.length_adaptive_alpha >= 0.0, "ppo.length_adaptive_alpha", "must be >= 0")
    _require(0.0 <= loss.ratio_clip_low < 1.0, "loss.ratio_clip_low", "must be in [0, 1)")
    _require(loss.ratio_clip_high >= 0.0, "loss.ratio_clip_high", "must be >= 0")
    _require(loss.ratio_clip_c is None or loss.ratio_clip_c > 1.0, "loss.ratio_clip_c", "must be > 1 or null")
    _require(loss.kl_coef >= 0.0, "loss.kl_coef", "must be >= 0")
    _require(loss.value_clip is None or loss.value_clip > 0.0, "loss.value_clip", "must be > 0 or null")
    _require(loss.value_loss_scale > 0.0, "loss.value_loss_scale", "must be > 0")
    gen = cfg.policy.generation
    _require(gen.temperature > 0.0, "policy.generation.temperature", "must be > 0")
    _require(0.0 < gen.top_p <= 1.0, "policy.generation.top_p", "must be in (0, 1]")
    if gen.backend == "vllm":
        _check_vllm(cfg)
    _require(cfg.cluster.colocated or 0 < cfg.cluster.policy_ranks < cfg.cluster.world_size,
             "cluster.policy_ranks", f"must be 0 (colocated) or leave the critic at least one of the "
             f"{cfg.cluster.world_size} ranks, got {cfg.cluster.policy_ranks}")
    for section, worker in [("policy", cfg.policy), ("value", cfg.value)]:
        _check_optimizer(f"{section}.optimizer", worker.optimizer)
        _check_layout(cfg, section, worker.parallel)
        _check_batches(cfg, section, worker.train_global_batch_size, worker.train_micro_batch_size,
                       len(cfg.cluster.pool(section)) // worker.parallel.tp)
        _require(worker.max_grad_norm > 0.0, f"{section}.max_grad_norm", "must be > 0")
    _check_optimizer("sft.optimizer", cfg.sft.optimizer)
    _check_schedules_and_sft(cfg)
    _check_models(cfg)
    _require(cfg.cluster.ray_timeout_s > 0, "cluster.ray_timeout_s", "must be > 0")
    _require(cfg.reward.num_workers >= 0, "reward.num_workers", "must be >= 0")
    _require(0 < cfg.reward.timeout_s < math.inf, "reward.timeout_s", "must be a finite number of seconds > 0")
    _require(0.0 <= cfg.sft.careless_stage.careless_fraction <= 1.0,
             "sft.careless_stage.careless_fraction", "must be in [0, 1]")
    tiny = cfg.data.tiny_math
    _require(tiny.max_number >= 2, "data.tiny_math.max_number", "must be >= 2")
    _require(1 <= tiny.min_ops <= tiny.max_ops, "data.tiny_math.min_ops",
             "must satisfy 1 <= data.tiny_math.min_ops <= data.tiny_math.max_ops")
    if cfg.data.task == "gsm8k":
        _require(cfg.data.train.path is not None, "data.train.path", "required when data.task is gsm8k")
        _require(cfg.data.validation.path is not None, "data.validation.path",
                 "required when data.task is gsm8k")


VLLM_INSTALL = ("`make venv` (the pinned CPU build, into .venv); on GPUs: pip install vllm==0.32.0 "
                "(pins torch 2.13.0; README)")


def _check_vllm(cfg: Config) -> None:
    """What the vLLM backend supports: one whole-model engine per policy rank, built on every rank."""
    key = "policy.generation.backend"
    _require(importlib.util.find_spec("vllm") is not None, key,
             f"vllm is not installed in this Python; install it with {VLLM_INSTALL}")
    _require(cfg.policy.parallel.tp == 1, "policy.parallel.tp",
             f"must be 1 with {key}=vllm (a tensor-parallel vLLM engine inside the training ranks is not "
             f"supported yet), got {cfg.policy.parallel.tp}")
    _require(cfg.policy.generation.top_p == 1.0, "policy.generation.top_p",
             f"must be 1 with {key}=vllm: vLLM reports log-probs of the top-p-truncated distribution, the "
             f"trainer of the full tempered one, got {cfg.policy.generation.top_p}")
    # vLLM's engine creates process groups collectively over all launched ranks, so every rank must build one.
    _require(cfg.cluster.colocated, "cluster.policy_ranks",
             f"must be 0 (policy and critic colocated) with {key}=vllm, got {cfg.cluster.policy_ranks}")
    _require(cfg.policy.generation.vllm_kv_cache_mib >= 1, "policy.generation.vllm_kv_cache_mib", "must be >= 1")


def _check_schedules_and_sft(cfg: Config) -> None:
    """Schedules and SFT counters: a bad one would only fail (or divide by zero) steps into a run."""
    for key, sched in [("policy.scheduler", cfg.policy.scheduler), ("value.scheduler", cfg.value.scheduler),
                       ("sft.scheduler", cfg.sft.scheduler)]:
        _require(sched.warmup_steps >= 0, f"{key}.warmup_steps", f"must be >= 0, got {sched.warmup_steps}")
        _require(sched.total_steps >= 0, f"{key}.total_steps", f"must be >= 0, got {sched.total_steps}")
        _require(0.0 <= sched.min_lr_ratio <= 1.0, f"{key}.min_lr_ratio",
                 f"must be in [0, 1], got {sched.min_lr_ratio}")
    sft, careless = cfg.sft, cfg.sft.careless_stage
    _require(sft.num_steps >= 0, "sft.num_steps", f"must be >= 0, got {sft.num_steps}")
    _require(sft.log_period >= 1, "sft.log_period", f"must be >= 1, got {sft.log_period}")
    _require(sft.max_grad_norm > 0.0, "sft.max_grad_norm", "must be > 0")
    _require(careless.num_steps >= 0, "sft.careless_stage.num_steps", f"must be >= 0, got {careless.num_steps}")
    _require(0.0 < careless.lr < math.inf, "sft.careless_stage.lr", f"must be finite and > 0, got {careless.lr}")
    _require(0.0 <= cfg.value.head_init_std < math.inf, "value.head_init_std", "must be finite and >= 0")
    for key, directory in [("logger.log_dir", cfg.logger.log_dir), ("sft.output_dir", sft.output_dir),
                           ("checkpointing.checkpoint_dir", cfg.checkpointing.checkpoint_dir)]:
        _require(directory.strip() != "", key, "must name a directory, got an empty string")


def _check_models(cfg: Config) -> None:
    """A tiny model's shape must be buildable, and tensor parallelism must split whole heads."""
    for section in ("policy", "value"):
        key = f"{section}.model.tiny"
        tiny = getattr(cfg, section).model.tiny
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                     "max_position_embeddings"):
            _require(getattr(tiny, name) >= 1, f"{key}.{name}", f"must be >= 1, got {getattr(tiny, name)}")
        _require(tiny.hidden_size % (2 * tiny.num_heads) == 0, f"{key}.hidden_size",
                 f"must be an even multiple of {key}.num_heads (rotary embeddings need an even head size)")
        _require(tiny.num_heads % tiny.num_kv_heads == 0, f"{key}.num_kv_heads", f"must divide {key}.num_heads")
        built = _tiny_architecture(cfg, section)
        tp = getattr(cfg, section).parallel.tp
        if built is not None and tp > 1:
            _require(built.num_kv_heads % tp == 0 and built.intermediate_size % tp == 0, f"{section}.parallel.tp",
                     f"{tp} must divide the tiny model's num_kv_heads ({built.num_kv_heads}) and "
                     f"intermediate_size ({built.intermediate_size}): tensor parallelism splits whole heads")


def _tiny_architecture(cfg: Config, section: str) -> TinyModelConfig | None:
    """The tiny config ``section``'s model is built from, or None when it is loaded from a path. A critic
    without its own path starts from the policy's starting weights: policy.model.path, or the SFT model,
    itself built from policy.model.path or policy.model.tiny."""
    if section == "value" and cfg.value.model.path is not None or cfg.policy.model.path is not None:
        return None
    if section == "value" and not cfg.ppo.init_from_sft:
        return cfg.value.model.tiny
    return cfg.policy.model.tiny


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # "Qwen/Qwen2.5-1.5B": resolved by transformers, not here


def _check_inputs_exist(cfg: Config) -> None:
    """Input files and directories named by a recipe exist: a typo fails here, before any compute. Only
    ``load`` checks this: ``from_dict`` rebuilds saved configs wherever they are read (``dtppo export``)."""
    if cfg.data.task == "gsm8k":
        for key, path in [("data.train.path", cfg.data.train.path), ("data.validation.path", cfg.data.validation.path)]:
            _require(Path(path).is_file(), key, f"file not found: {path}")
    for key, path in [("policy.model.path", cfg.policy.model.path), ("value.model.path", cfg.value.model.path)]:
        _require(path is None or Path(path).is_dir() or bool(_HUB_ID.fullmatch(path)), key,
                 f"no such model directory (nor a hub name like org/model): {path}")


def _check_optimizer(key: str, opt: OptimizerConfig) -> None:
    _require(0.0 < opt.lr < math.inf, f"{key}.lr", f"must be finite and > 0, got {opt.lr}")
    _require(opt.weight_decay >= 0.0, f"{key}.weight_decay", "must be >= 0")
    _require(all(0.0 <= b < 1.0 for b in opt.betas), f"{key}.betas", "each must be in [0, 1)")
    _require(opt.eps > 0.0, f"{key}.eps", "must be > 0")


def _check_layout(cfg: Config, section: str, parallel: ParallelConfig) -> None:
    key = f"{section}.parallel.tp"
    _require(parallel.tp >= 1, key, f"must be >= 1, got {parallel.tp}")
    pool = len(cfg.cluster.pool(section))
    _require(pool % parallel.tp == 0, key,
             f"{parallel.tp} must divide the {section} pool's {pool} ranks (cluster.num_nodes * "
             f"cluster.workers_per_node, split by cluster.policy_ranks)")
    _require(not parallel.sequence_parallel or parallel.tp > 1, f"{section}.parallel.sequence_parallel",
             f"needs {key} > 1")
    rkey = f"{section}.parallel.dp_replicate"
    _require(parallel.dp_replicate >= 1, rkey, f"must be >= 1, got {parallel.dp_replicate}")
    _require((pool // parallel.tp) % parallel.dp_replicate == 0, rkey,
             f"{parallel.dp_replicate} must divide the {section} pool's {pool // parallel.tp} data-parallel ranks "
             f"(its ranks / {key})")


def _check_batches(cfg: Config, section: str, global_batch: int, micro_batch: int, dp: int) -> None:
    """A minibatch of ``global_batch`` samples is split evenly over ``dp`` ranks, then into microbatches."""
    gkey, mkey = f"{section}.train_global_batch_size", f"{section}.train_micro_batch_size"
    _require(global_batch >= 1, gkey, f"must be >= 1, got {global_batch}")
    _require(micro_batch >= 1, mkey, f"must be >= 1, got {micro_batch}")
    _require(cfg.samples_per_step % global_batch == 0, gkey,
             f"{global_batch} must divide ppo.num_prompts_per_step * ppo.num_generations_per_prompt "
             f"= {cfg.samples_per_step}")
    _require(global_batch % dp == 0, gkey,
             f"{global_batch} must divide evenly over the {dp} data-parallel ranks "
             f"(the {section} pool's ranks / {section}.parallel.tp)")
    _require((global_batch // dp) % micro_batch == 0, mkey,
             f"{micro_batch} must divide the per-rank share of {gkey} = {global_batch // dp}")
