"""Cross-field and range rules of a Config, checked once at load; each failure names its dotted key."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path
from typing import Literal

from dtppo.config.reward_spec import BUILTINS, MODEL_NAME, parse_spec
from dtppo.config.schema import (
    Config,
    ConfigError,
    DatasetConfig,
    OptimizerConfig,
    ParallelConfig,
    TinyModelConfig,
)


def _require(ok: bool, key: str, problem: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {problem}")


def check(cfg: Config) -> None:
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
        ("policy.logprob_chunk_size", cfg.policy.logprob_chunk_size),
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
    _require(ppo.seq_logprob_error_threshold is None or ppo.seq_logprob_error_threshold >= 1.0,
             "ppo.seq_logprob_error_threshold", "must be >= 1 (no error is 1) or null")
    _check_grpo(cfg)
    _require(0.0 <= loss.ratio_clip_low < 1.0, "loss.ratio_clip_low", "must be in [0, 1)")
    _require(loss.ratio_clip_high >= 0.0, "loss.ratio_clip_high", "must be >= 0")
    _require(loss.ratio_clip_c is None or loss.ratio_clip_c > 1.0, "loss.ratio_clip_c", "must be > 1 or null")
    _require(loss.kl_coef >= 0.0, "loss.kl_coef", "must be >= 0")
    _require(loss.value_clip is None or loss.value_clip > 0.0, "loss.value_clip", "must be > 0 or null")
    _require(loss.value_loss_scale > 0.0, "loss.value_loss_scale", "must be > 0")
    _require(loss.rollout_is_cap >= 1.0, "loss.rollout_is_cap", f"must be >= 1, got {loss.rollout_is_cap}")
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
    _require(0.0 <= tiny.hard_fraction <= 1.0, "data.tiny_math.hard_fraction", "must be in [0, 1]")
    _require(tiny.hard_fraction == 0 or tiny.hard_max_number > tiny.max_number, "data.tiny_math.hard_max_number",
             "must be > data.tiny_math.max_number when data.tiny_math.hard_fraction > 0")
    _check_task(cfg)
    _check_reward(cfg)
    for key, name in [("logger.wandb.project", cfg.logger.wandb.project),
                      ("logger.mlflow.experiment", cfg.logger.mlflow.experiment),
                      ("logger.mlflow.tracking_uri", cfg.logger.mlflow.tracking_uri)]:
        _require(name is None or name.strip() != "", key, "must not be empty")


def _check_task(cfg: Config) -> None:
    """A file-backed task names its files; a custom one its prompt column; SFT needs worked solutions."""
    data = cfg.data
    if data.task == "tiny_math":
        return
    for key, dataset in [("data.train", data.train), ("data.validation", data.validation)]:
        _require(dataset.path is not None, f"{key}.path", f"required when data.task is {data.task}")
    if data.task == "custom":
        _require(data.prompt_key.strip() != "", "data.prompt_key", "must name the prompt column")
        _require(data.answer_key is None or data.answer_key.strip() != "", "data.answer_key",
                 "must name the reference column, or be null")
        _require(not cfg.ppo.init_from_sft, "ppo.init_from_sft",
                 "SFT trains on worked solutions, which data.task custom does not have: start from a model "
                 "(policy.model.path) instead")


def _check_reward(cfg: Config) -> None:
    """Reward functions parse, have unique metric names and one weight each; custom tasks name a reward."""
    reward = cfg.reward
    names = []
    for i, spec in enumerate(reward.functions):
        try:
            names.append(parse_spec(spec).name)
        except ValueError as err:
            raise ConfigError(f"reward.functions[{i}]: {err}") from None
    for i, name in enumerate(names):
        _require(name != MODEL_NAME, f"reward.functions[{i}]", f"{name!r} is the reward model's metric name "
                 f"(train/reward/{MODEL_NAME}): rename the function")
        _require(name not in names[:i], f"reward.functions[{i}]", f"a second function named {name!r}: metric "
                 f"names (train/reward/<name>) must be unique")
    _require(len(reward.weights) == len(reward.functions), "reward.weights",
             f"needs one weight per reward function ({len(reward.functions)}), got {len(reward.weights)}")
    _require(all(math.isfinite(w) for w in reward.weights), "reward.weights", "must be finite numbers")
    _require(reward.functions or reward.model.path is not None, "reward.functions",
             f"data.task {cfg.data.task} has no verifier: name at least one reward function, or reward.model.path")
    builtin = reward.accuracy_from is not None and reward.accuracy_from in BUILTINS
    _require(reward.accuracy_from is None or builtin or reward.accuracy_from in names, "reward.accuracy_from",
             f"{reward.accuracy_from!r} is neither a built-in verifier nor one of reward.functions {names}")
    model = reward.model
    _require(model.batch_size >= 1, "reward.model.batch_size", f"must be >= 1, got {model.batch_size}")
    _require(model.max_length >= 1, "reward.model.max_length", f"must be >= 1, got {model.max_length}")
    _require(math.isfinite(model.weight), "reward.model.weight", "must be a finite number")


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
    _require(not cfg.policy.generation.decode_graph, "policy.generation.decode_graph",
             f"applies to {key}=torch only (vLLM captures its own CUDA graphs)")


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
    _require(sft.val_period >= 0, "sft.val_period", f"must be >= 0, got {sft.val_period}")
    _require(sft.patience >= 0, "sft.patience", f"must be >= 0, got {sft.patience}")
    _require(sft.patience == 0 or sft.val_period > 0, "sft.patience", "needs sft.val_period > 0")
    _require(0.0 <= sft.min_improvement <= 1.0, "sft.min_improvement", "must be in [0, 1]")
    _require(0.0 <= sft.min_accuracy <= 1.0, "sft.min_accuracy", "must be in [0, 1]")
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


def check_inputs_exist(cfg: Config) -> None:
    """Input files and directories named by a recipe exist: a typo fails here, before any compute. Only
    ``load`` checks this: ``from_dict`` rebuilds saved configs wherever they are read (``dtppo export``)."""
    if cfg.data.task != "tiny_math":
        for key, dataset in [("data.train", cfg.data.train), ("data.validation", cfg.data.validation)]:
            _check_dataset(key, dataset)
    _check_reward_functions_load(cfg)
    for key, path in [("policy.model.path", cfg.policy.model.path), ("value.model.path", cfg.value.model.path),
                      ("reward.model.path", cfg.reward.model.path)]:
        _require(path is None or Path(path).is_dir() or bool(_HUB_ID.fullmatch(path)), key,
                 f"no such model directory (nor a hub name like org/model): {path}")
        _require(path is None or not Path(path).is_dir() or (Path(path) / "config.json").is_file(), key,
                 f"{path} is not an HF model directory (no config.json)")


def _check_reward_functions_load(cfg: Config) -> None:
    """Each reward function's file or module imports and holds a callable of that name. This runs the user's
    module in this process, as ``import`` would: the recipe names it as code to run."""
    from dtppo.rewards.functions import RewardFunctionError, reward_function

    for i, spec in enumerate(cfg.reward.functions):
        try:
            reward_function(spec)
        except RewardFunctionError as err:
            raise ConfigError(f"reward.functions[{i}]: {err}") from None


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


def check_optional_packages(cfg: Config) -> None:
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

def warn_unusual(cfg: Config) -> None:
    """Valid settings that exist for one experiment, not for training: said loudly, once per run (at load,
    in the launching process; ranks rebuild the config with ``from_dict``, which stays quiet)."""
    if not cfg.value.shift_values:
        print("dtppo: WARNING: value.shift_values=false reads V(s_t) from the hidden state that has already "
              "seen token t. It exists only for the value-alignment experiment (bench/critic.py alignment); "
              "do not train with it.", file=sys.stderr, flush=True)

