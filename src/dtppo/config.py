"""Typed, frozen configuration tree loaded from YAML recipes.

A recipe may name one parent with ``defaults: other.yaml`` (resolved relative to the recipe); its keys are
merged over the parent's. Command-line overrides ``section.key=value`` are parsed as YAML scalars and merged
last. The merged mapping is then converted into the dataclass tree below: unknown keys and wrong types fail
with the full dotted key path, and cross-field rules are checked once here so no later code re-validates.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import re
import sys
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
    """The shape of the tiny random-init Qwen2 built when a model has no ``path``."""

    hidden_size: int = 128
    """Width of the residual stream; an even multiple of ``num_heads`` (rotary embeddings)."""
    num_layers: int = 4
    """Decoder blocks."""
    num_heads: int = 4
    """Attention (query) heads."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention); divides ``num_heads``."""
    intermediate_size: int = 512
    """Width of the MLP's hidden layer."""
    max_position_embeddings: int = 512
    """Longest sequence (prompt + response) the rotary table covers."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Where a model's weights come from."""

    path: str | None = None
    """Local HF model directory (or a hub name like org/model); null = build ``tiny`` below (random init).
    For the critic, null = the policy's starting weights (a backbone copy), or a tiny random model."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Used only when ``path`` is null."""


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """AdamW."""

    lr: float = 1e-4
    """Peak learning rate (the schedule multiplies it)."""
    weight_decay: float = 0.01
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.95)
    """Adam's (β1, β2)."""
    eps: float = 1e-8
    """Adam's ε."""


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Learning-rate schedule over optimizer steps: linear warmup, then constant or cosine decay."""

    kind: Literal["constant", "cosine"] = "constant"
    """constant | cosine (to ``min_lr_ratio`` over ``total_steps`` optimizer steps)."""
    warmup_steps: int = 0
    """Optimizer steps of linear warmup from lr/warmup_steps to lr."""
    min_lr_ratio: float = 0.1
    """Cosine: the final learning rate as a fraction of the peak."""
    total_steps: int | None = None
    """Optimizer steps the cosine spans; null = the stage's length, derived once when the Config is built
    (sft: ``sft.num_steps``; policy and value: the optimizer steps of the whole PPO run)."""


@dataclass(frozen=True, kw_only=True)
class GenerationConfig:
    """Sampling of rollouts (and of validation responses)."""

    max_new_tokens: int = 48
    """Responses longer than this are cut and counted in train/truncation_rate."""
    temperature: float = 1.0
    """Sampling temperature; training log-probs use the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass (1 = off)."""
    val_greedy: bool = True
    """Validation decodes greedily."""
    backend: Literal["torch", "vllm"] = "torch"
    """Who samples rollouts and validation answers: ``torch`` (dtppo's KV-cache sampler on the rank's replica)
    or ``vllm`` (one in-process vLLM engine per policy rank, refit in place after each update; needs vLLM
    installed: ``make venv`` puts the CPU build in .venv, README names the GPU wheel)."""
    vllm_kv_cache_mib: int = 256
    """KV-cache memory of each rank's vLLM engine, in MiB (vLLM's ``kv_cache_memory_bytes``)."""


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """How a model's pool of ranks is split: data-parallel (FSDP/HSDP) × tensor-parallel."""

    tp: int = 1
    """Tensor-parallel ranks per model replica; divides the pool's ranks."""
    sequence_parallel: bool = False
    """Shard RMSNorm activations over the sequence too (needs tp > 1)."""
    unsharded_grad_accumulation: bool = True
    """FSDP: gather parameters once per optimizer step and reduce-scatter the microbatches' summed gradients
    once (false: per microbatch, less memory)."""
    dp_replicate: int = 1
    """Whole-model replicas among the data-parallel ranks (HSDP); = dp ranks: every rank holds the model and
    gradients are all-reduced once per step (no gathers)."""


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """The actor: its model, layout, optimizer, schedule, sampling and batch sizes."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy's starting weights (unless ``ppo.init_from_sft``)."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """The policy pool's layout."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """The policy's AdamW."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """The policy's learning-rate schedule."""
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    """Rollout sampling."""
    train_global_batch_size: int = 32
    """Samples per optimizer step (a minibatch); divides the samples per step and the data-parallel ranks."""
    train_micro_batch_size: int = 32
    """Most samples per forward/backward on one rank: clamped to the rank's share of the global batch (so any
    rank count works); must divide that share when smaller (``Config.micro_batch_size``)."""
    logprob_batch_size: int = 64
    """Most samples per no-grad forward on one rank when recomputing log-probs."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global L2 norm."""
    sequence_packing: bool = True
    """Pack each (micro)batch's sequences into fewer rows, no pad tokens computed (same numbers as padded
    within fp32 round-off; docs/performance.md)."""


@dataclass(frozen=True, kw_only=True)
class ValueConfig:
    """The critic: a backbone with a scalar head, its layout, optimizer, schedule and batch sizes."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The critic's backbone; path null = the policy's starting weights, or a tiny random model."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """The critic pool's layout."""
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=1e-3))
    """The critic's AdamW."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """The critic's learning-rate schedule."""
    train_global_batch_size: int = 32
    """As ``policy.train_global_batch_size``."""
    train_micro_batch_size: int = 32
    """As ``policy.train_micro_batch_size``."""
    inference_batch_size: int = 64
    """Most samples per no-grad forward on one rank when computing values."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global L2 norm."""
    head_init_std: float = 0.02
    """Scalar head ~ N(0, std), drawn from its own generator seeded by ``ppo.seed``."""
    shift_values: bool = True
    """V(s_t) = head(h[t-1]). false only for the value-alignment experiment (a warning says so)."""
    sequence_packing: bool = True
    """As ``policy.sequence_packing``; V(s_t) is shifted within each packed sequence."""


@dataclass(frozen=True, kw_only=True)
class PPOConfig:
    """The PPO loop: step counts, batch shape, GAE, validation."""

    seed: int = 0
    """Seeds models, sampling and the prompt order."""
    max_num_steps: int = 50
    """PPO steps (rollout + updates) of the run."""
    num_prompts_per_step: int = 64
    """Prompts drawn per step."""
    num_generations_per_prompt: int = 1
    """Responses sampled per prompt."""
    ppo_epochs: int = 1
    """Passes over each step's samples; each pass = critic update, then policy update."""
    policy_training_start_step: int = 0
    """Critic warmup: the policy is not updated before this many steps."""
    gamma: float = 1.0
    """Discount γ."""
    lambda_value: float = 1.0
    """GAE λ for the value targets (returns)."""
    lambda_policy: float = 1.0
    """GAE λ for the advantages."""
    length_adaptive_alpha: float = 0.0
    """> 0: per-sample λ_policy = 1 - 1/(α·len) (VAPO)."""
    normalize_advantages: bool = True
    """Whiten advantages over all valid tokens of the step."""
    advantage_estimator: Literal["gae", "grpo"] = "gae"
    """``gae``: GAE over the critic's V(s_t). ``grpo``: critic-free, each sample's outcome reward normalised
    within its prompt's group of ``num_generations_per_prompt`` samples (needs >= 2); no value model is built,
    trained, checkpointed or logged (the ``value`` section is neither used nor validated), and
    ``normalize_advantages`` does not apply (GRPO has no step whitening)."""
    val_period: int = 10
    """Validate every N steps (and at the last step)."""
    val_at_start: bool = True
    """Validate before the first step."""
    max_val_samples: int = 256
    """Validation problems scored."""
    val_batch_size: int = 256
    """Validation prompts decoded at once."""
    init_from_sft: bool = False
    """Start policy and critic from ``sft.output_dir`` (running SFT first if missing)."""
    max_consecutive_nonfinite_steps: int = 3
    """Optimizer steps with a NaN/inf loss or gradient are skipped; this many in a row (per model) stop the
    run (exit 3). 0 = never stop."""


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    """The clipped PPO and value losses, and the KL penalty."""

    ratio_clip_low: float = 0.2
    """ε_low: the ratio is clipped below at 1 - ε_low."""
    ratio_clip_high: float = 0.2
    """ε_high: the ratio is clipped above at 1 + ε_high."""
    ratio_clip_c: float | None = None
    """Dual clip c > 1 for A < 0; null = off."""
    kl_coef: float = 0.0
    """β; 0 = no reference model."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """k1 | k2 | k3."""
    kl_in_reward: bool = False
    """true: -β·KL_t in the token rewards; false: β·KL in the policy loss."""
    value_clip: float | None = 0.5
    """ε_v around the old values; null = unclipped."""
    value_loss_scale: float = 1.0
    """Multiplies the critic's loss."""


@dataclass(frozen=True, kw_only=True)
class TinyMathConfig:
    """The synthetic arithmetic word problems."""

    max_number: int = 20
    """Operands and start values are drawn from 1..max_number."""
    min_ops: int = 1
    """Fewest operations per problem."""
    max_ops: int = 2
    """Most operations per problem."""
    validation_seed: int = 12345
    """The held-out set; its questions never appear in training."""


@dataclass(frozen=True, kw_only=True)
class DatasetConfig:
    """One split of a file-backed task."""

    path: str | None = None
    """A GSM8K jsonl file (train: the training rows; validation: the first ``ppo.max_val_samples`` rows)."""
    hf_config: str | None = None
    """The configuration (subset) of a hub dataset id in ``path``, e.g. ``main`` for ``openai/gsm8k``; only
    for hub ids."""
    split: str | None = None
    """The split to read from an HF dataset: required for a hub id and for a ``save_to_disk`` directory that
    holds several splits (a DatasetDict); not for a jsonl file."""


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """The task, its files and the prompt format."""

    task: Literal["gsm8k", "tiny_math"] = "tiny_math"
    """tiny_math (synthetic) | gsm8k (jsonl files below)."""
    train: DatasetConfig = field(default_factory=DatasetConfig)
    """GSM8K train jsonl."""
    validation: DatasetConfig = field(default_factory=DatasetConfig)
    """GSM8K test jsonl."""
    tiny_math: TinyMathConfig = field(default_factory=TinyMathConfig)
    """The synthetic task's generator."""
    system_prompt: str | None = None
    """Prepended as the system turn; null = none."""
    max_prompt_tokens: int = 256
    """GSM8K rows with a longer prompt are bad rows (below); tiny_math prompts keep their last tokens."""
    on_bad_row: Literal["skip", "error"] = "skip"
    """GSM8K rows with a missing field, an empty or non-numeric answer, or a prompt over max_prompt_tokens:
    skip (counted, logged) | error (file:line named)."""


@dataclass(frozen=True, kw_only=True)
class CarelessStageConfig:
    """An optional planted flaw after SFT (tiny_math only): bare wrong "#### N" answers."""

    num_steps: int = 0
    """Optimizer steps of the stage; 0 = no stage."""
    lr: float = 3e-4
    """Its constant learning rate."""
    careless_fraction: float = 0.6
    """Fraction of its examples that are bare wrong answers."""


@dataclass(frozen=True, kw_only=True)
class SFTConfig:
    """Supervised fine-tuning: the checkpoint PPO starts from."""

    output_dir: str = "runs/sft"
    """An HF directory (model + tokenizer)."""
    num_steps: int = 500
    """Optimizer steps."""
    batch_size: int = 32
    """Examples per optimizer step."""
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=3e-3))
    """SFT's AdamW."""
    scheduler: SchedulerConfig = field(
        default_factory=lambda: SchedulerConfig(kind="cosine", warmup_steps=30)
    )
    """SFT's learning-rate schedule (total_steps null = ``num_steps``)."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global L2 norm."""
    careless_stage: CarelessStageConfig = field(default_factory=CarelessStageConfig)
    """The planted flaw, trained after the main stage."""
    log_period: int = 50
    """Log every N steps (and the last)."""


@dataclass(frozen=True, kw_only=True)
class RewardConfig:
    """Scoring of responses against the reference answers."""

    num_workers: int = 2
    """Scoring processes (local run) or Ray actors (Ray run); 0 = in rank 0's process."""
    timeout_s: float = 30.0
    """A chunk not scored by then gets 0.0 instead of stalling the step."""


@dataclass(frozen=True, kw_only=True)
class WandbConfig:
    """Weights & Biases logging of the PPO run's metrics."""

    enabled: bool = False
    """Send the PPO run's metrics.jsonl records (same names and steps) to Weights & Biases from rank 0; needs
    ``pip install 'dtppo[wandb]'``. A resumed run continues the W&B run whose id the checkpoint holds."""
    project: str = "dtppo"
    """The W&B project the run is created in."""
    entity: str | None = None
    """The W&B team or user; null: the account's default entity."""
    run_name: str | None = None
    """The run's display name; null: W&B picks one."""
    mode: Literal["online", "offline"] = "online"
    """online: stream to the W&B server; offline: write the run under ``<log_dir>/wandb`` only (upload it
    later with ``wandb sync``)."""


@dataclass(frozen=True, kw_only=True)
class MlflowConfig:
    """MLflow logging of the PPO run's metrics."""

    enabled: bool = False
    """Send the PPO run's metrics.jsonl records (same names and steps) to MLflow from rank 0; needs
    ``pip install 'dtppo[mlflow]'``. A resumed run continues the MLflow run whose id the checkpoint holds."""
    tracking_uri: str | None = None
    """Where runs are stored: a tracking server (``http://host:5000``), a database (``sqlite:///mlflow.db``,
    needs the full ``mlflow`` package) or a directory (``file:/path``, which MLflow 3 opens only with
    ``MLFLOW_ALLOW_FILE_STORE=true``); null: MLflow's own choice (``MLFLOW_TRACKING_URI``, else its default)."""
    experiment: str = "dtppo"
    """The MLflow experiment the run is created in (created if missing)."""
    run_name: str | None = None
    """The run's name; null: MLflow picks one."""


@dataclass(frozen=True, kw_only=True)
class LoggerConfig:
    """Metrics output."""

    log_dir: str = "runs/ppo"
    """metrics.jsonl and TensorBoard events."""
    tensorboard: bool = True
    """Write TensorBoard events too."""
    progress: bool = True
    """One console line per step with ETA."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases logging (off by default)."""
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    """MLflow logging (off by default)."""


@dataclass(frozen=True, kw_only=True)
class CheckpointingConfig:
    """Periodic checkpoints; a run resumes from the latest complete one."""

    enabled: bool = True
    """Save and resume."""
    checkpoint_dir: str = "runs/ppo/checkpoints"
    """Holds step_N directories."""
    save_period: int = 10
    """Save every N steps (and at the last step)."""
    keep_last: int = 2
    """Older complete checkpoints are deleted."""


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """Where the ranks run and how policy and critic share them."""

    num_nodes: int = 1
    """nodes x workers_per_node = ranks; each model's dp = its ranks / its parallel.tp."""
    workers_per_node: int = 1
    """> 1: `dtppo ppo` starts the ranks itself (or run it under torchrun)."""
    backend: Literal["local", "ray"] = "local"
    """local (this machine: spawned ranks / torchrun) | ray (one Ray actor per rank)."""
    ray_address: str | None = None
    """Attach to this Ray cluster (or $RAY_ADDRESS); null = start a private local one."""
    ray_placement: Literal["pack", "spread"] = "pack"
    """pack | spread: placement-group strategy for the rank bundles."""
    ray_temp_dir: str = "/tmp/dtppo-ray"
    """Ray session files of a private local instance (short: Ray's socket paths)."""
    ray_timeout_s: float = 120.0
    """Waiting for resources and actors before giving up."""
    policy_ranks: int = 0
    """0: policy and critic colocated on every rank. N: policy on ranks [0, N), critic on the other ranks,
    so the two updates run at the same time on different devices."""

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
    """A whole run. Schedules with ``total_steps: null`` get their stage's length here, once (cleanrl's
    "filled in at runtime" values): the built Config holds numbers, never null, for them."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """The actor."""
    value: ValueConfig = field(default_factory=ValueConfig)
    """The critic."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """The PPO loop."""
    loss: LossConfig = field(default_factory=LossConfig)
    """The losses."""
    data: DataConfig = field(default_factory=DataConfig)
    """The task and its prompts."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised fine-tuning before PPO."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Scoring."""
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    """Metrics output."""
    checkpointing: CheckpointingConfig = field(default_factory=CheckpointingConfig)
    """Checkpoints and resume."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Ranks and their placement."""

    def __post_init__(self) -> None:
        # A frozen dataclass fills derived fields through object.__setattr__ (the documented way).
        for name, length in [("sft", max(self.sft.num_steps, 0)), ("policy", self.optimizer_steps("policy")),
                             ("value", self.optimizer_steps("value"))]:
            section = getattr(self, name)
            if section.scheduler.total_steps is None:
                scheduler = dataclasses.replace(section.scheduler, total_steps=length)
                object.__setattr__(self, name, dataclasses.replace(section, scheduler=scheduler))

    def optimizer_steps(self, role: Literal["policy", "value"]) -> int:
        """Optimizer steps a PPO run makes on ``role``'s model: one per global batch of each epoch of each
        step (the policy's only from ``ppo.policy_training_start_step`` on). 0 for a config that ``_check``
        refuses (no global batch)."""
        ppo, batch = self.ppo, getattr(self, role).train_global_batch_size
        steps = ppo.max_num_steps - (ppo.policy_training_start_step if role == "policy" else 0)
        return max(steps, 0) * ppo.ppo_epochs * (self.samples_per_step // batch if batch > 0 else 0)

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

    def data_parallel_size(self, role: Literal["policy", "value"]) -> int:
        """Data-parallel ranks of ``role``'s pool: its ranks / its ``parallel.tp``."""
        return len(self.cluster.pool(role)) // getattr(self, role).parallel.tp

    def micro_batch_size(self, role: Literal["policy", "value"]) -> int:
        """Samples per forward/backward on one rank: ``train_micro_batch_size`` is an upper bound, clamped to a
        rank's share of the global batch, so one recipe runs at any rank count. This is the size the engine's
        microbatch loop runs, which never takes more rows than the rank holds."""
        section = getattr(self, role)
        return min(section.train_micro_batch_size,
                   section.train_global_batch_size // max(self.data_parallel_size(role), 1))

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
    _check_optional_packages(cfg)
    _warn_unusual(cfg)
    return cfg


def from_dict(tree: dict[str, Any]) -> Config:
    """Build and validate a config from an already merged mapping (e.g. one saved in a checkpoint)."""
    cfg = _build(Config, tree, path="")
    _check(cfg)
    return cfg


def _warn_unusual(cfg: Config) -> None:
    """Valid settings that exist for one experiment, not for training: said loudly, once per run (at load,
    in the launching process; ranks rebuild the config with ``from_dict``, which stays quiet)."""
    if not cfg.value.shift_values:
        print("dtppo: WARNING: value.shift_values=false reads V(s_t) from the hidden state that has already "
              "seen token t. It exists only for the value-alignment experiment (bench/value_alignment.py); "
              "do not train with it.", file=sys.stderr, flush=True)


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
    _check_grpo(cfg)
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
    workers = [("policy", cfg.policy), ("value", cfg.value)]
    for section, worker in workers if ppo.advantage_estimator == "gae" else workers[:1]:  # grpo: no critic
        _check_optimizer(f"{section}.optimizer", worker.optimizer)
        _check_layout(cfg, section, worker.parallel)
        _check_batches(cfg, section)
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
    for key, name in [("logger.wandb.project", cfg.logger.wandb.project),
                      ("logger.mlflow.experiment", cfg.logger.mlflow.experiment),
                      ("logger.mlflow.tracking_uri", cfg.logger.mlflow.tracking_uri)]:
        _require(name is None or name.strip() != "", key, "must not be empty")


def _check_grpo(cfg: Config) -> None:
    """GRPO's baseline is the group: one sample per prompt has none, and there is no critic to place or warm up."""
    if cfg.ppo.advantage_estimator != "grpo":
        return
    _require(cfg.ppo.num_generations_per_prompt >= 2, "ppo.num_generations_per_prompt",
             f"must be >= 2 with ppo.advantage_estimator=grpo (the group is the baseline), "
             f"got {cfg.ppo.num_generations_per_prompt}")
    _require(cfg.ppo.policy_training_start_step == 0, "ppo.policy_training_start_step",
             "must be 0 with ppo.advantage_estimator=grpo (it is a critic warmup; grpo has no critic)")
    _require(cfg.cluster.colocated, "cluster.policy_ranks",
             "must be 0 with ppo.advantage_estimator=grpo (there is no critic pool to give ranks to)")
    _require(not (cfg.loss.kl_coef > 0.0 and cfg.loss.kl_in_reward), "loss.kl_in_reward",
             "must be false with ppo.advantage_estimator=grpo (its advantages use the outcome reward only; "
             "the KL goes in the loss, as in DeepSeekMath)")


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
        for key, dataset in [("data.train", cfg.data.train), ("data.validation", cfg.data.validation)]:
            _check_dataset(key, dataset)
    for key, path in [("policy.model.path", cfg.policy.model.path), ("value.model.path", cfg.value.model.path)]:
        _require(path is None or Path(path).is_dir() or bool(_HUB_ID.fullmatch(path)), key,
                 f"no such model directory (nor a hub name like org/model): {path}")
        _require(path is None or not Path(path).is_dir() or (Path(path) / "config.json").is_file(), key,
                 f"{path} is not an HF model directory (no config.json)")


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
    _require(kind is not None, f"{key}.path",
             f"file not found: {dataset.path} (nor a dataset directory, nor a hub dataset id like org/name)")
    _require(dataset.hf_config is None or kind == "hub", f"{key}.hf_config", f"only for a hub dataset id, and "
             f"{dataset.path} is a local {'file' if kind == 'jsonl' else 'directory'}")
    _require(dataset.split is None or kind != "jsonl", f"{key}.split", f"{dataset.path} is a jsonl file: no splits")
    if kind != "jsonl":
        _require_package("datasets", f"{key}.path", "hf")
    _require(dataset.split is not None or kind != "hub", f"{key}.split", f"required for hub dataset {dataset.path}")
    if kind == "disk":
        index = Path(dataset.path) / "dataset_dict.json"
        splits = json.loads(index.read_text())["splits"] if index.is_file() else None
        _require(splits is not None or (Path(dataset.path) / "state.json").is_file(), f"{key}.path",
                 f"{dataset.path} is not a dataset directory written by save_to_disk (no dataset_dict.json or "
                 f"state.json)")
        _require(splits is None or dataset.split in splits, f"{key}.split",
                 f"{dataset.path} holds the splits {splits}: name one of them, got {dataset.split!r}")
        _require(splits is not None or dataset.split is None, f"{key}.split",
                 f"{dataset.path} holds a single dataset: no splits")


def _check_optional_packages(cfg: Config) -> None:
    if cfg.logger.wandb.enabled:
        _require_package("wandb", "logger.wandb.enabled", "wandb")
    if cfg.logger.mlflow.enabled:
        _require_package("mlflow", "logger.mlflow.enabled", "mlflow")


def _require_package(module: str, key: str, extra: str) -> None:
    """``module`` can be imported (found without importing it: that can take seconds)."""
    _require(importlib.util.find_spec(module) is not None, key,
             f"needs the {module} package: pip install 'dtppo[{extra}]'")


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


def _check_batches(cfg: Config, section: Literal["policy", "value"]) -> None:
    """A minibatch of ``global_batch`` samples is split evenly over the ``dp`` ranks, then into microbatches
    of at most ``train_micro_batch_size`` (an upper bound: clamped to the rank's share, see
    ``Config.micro_batch_size``)."""
    worker, dp = getattr(cfg, section), cfg.data_parallel_size(section)
    global_batch, micro_batch = worker.train_global_batch_size, worker.train_micro_batch_size
    gkey, mkey = f"{section}.train_global_batch_size", f"{section}.train_micro_batch_size"
    _require(global_batch >= 1, gkey, f"must be >= 1, got {global_batch}")
    _require(micro_batch >= 1, mkey, f"must be >= 1, got {micro_batch}")
    _require(cfg.samples_per_step % global_batch == 0, gkey,
             f"{global_batch} must divide ppo.num_prompts_per_step * ppo.num_generations_per_prompt "
             f"= {cfg.samples_per_step}")
    _require(global_batch % dp == 0, gkey,
             f"{global_batch} must divide evenly over the {dp} data-parallel ranks "
             f"(the {section} pool's ranks / {section}.parallel.tp)")
    share = global_batch // dp
    _require(share % cfg.micro_batch_size(section) == 0, mkey,
             f"{micro_batch} must divide the per-rank share of {gkey} = {share} (or be at least that share)")


def batch_clamp_notes(cfg: Config) -> list[str]:
    """One line per role whose per-rank sizes were clamped to a rank's share (logged once, by rank 0):
    ``train_micro_batch_size`` against the global batch; the inference chunk sizes (``policy.logprob_batch_size``,
    ``value.inference_batch_size``) against the step's samples, which ``map_rows`` splits over the same ranks."""
    notes = []
    for role, chunk_key in [("policy", "logprob_batch_size"), ("value", "inference_batch_size")]:
        section, dp = getattr(cfg, role), cfg.data_parallel_size(role)
        clamped = []
        if cfg.micro_batch_size(role) < section.train_micro_batch_size:
            clamped.append(f"train_micro_batch_size {section.train_micro_batch_size} -> {cfg.micro_batch_size(role)}")
        chunk, step_share = getattr(section, chunk_key), cfg.samples_per_step // dp
        if chunk > step_share:
            clamped.append(f"{chunk_key} {chunk} -> {step_share}")
        if clamped:
            notes.append(f"{role}: per-rank sizes clamped to a rank's share over {dp} data-parallel ranks: "
                         + ", ".join(clamped))
    return notes
