"""``dtppo export``: a training checkpoint to HF directories that ``transformers`` loads directly."""

from __future__ import annotations

from pathlib import Path

import torch

from dtppo import config as config_lib
from dtppo.checkpoint import store as checkpoint
from dtppo.config import LoraConfig
from dtppo.errors import InputError
from dtppo.models.causal_lm import build_policy, tiny_qwen2_config
from dtppo.models.description import CRITIC, POLICY, build_described, described, stored_dtype
from dtppo.models.lora import add_adapters, frozen_base, merged_model, save_adapter
from dtppo.models.ties import tied_names, untied
from dtppo.models.tokenizer import load_tokenizer
from dtppo.models.value import ValueModel, build_backbone


def resolve_step_dir(path: str | Path) -> Path:
    """``path`` itself if it is a ``step_N`` checkpoint, else its latest complete ``step_N``."""
    path = Path(path)
    if checkpoint.is_step_dir(path):
        return path
    if not path.is_dir():
        raise InputError(f"{path}: no such checkpoint directory")
    step = checkpoint.latest_step(path)
    if step is None:
        raise InputError(f"{path}: no checkpoint (step_N/) in this directory")
    return path / f"step_{step}"


def export_checkpoint(checkpoint_dir: str | Path, out_dir: str | Path, overrides: tuple[str, ...] = ()) -> list[Path]:
    """Write ``out_dir/policy`` (causal LM) and ``out_dir/critic`` (``ValueModel.save_pretrained``'s layout: token
    classification with num_labels=1, or for a family transformers has no such class for, the base model plus
    ``value_head.safetensors``); a GRPO run (``ppo.advantage_estimator=grpo``) has no critic, so only the policy is
    written. The weights are in ``export.dtype`` (``overrides``: ``export.*`` keys over the checkpoint's config).

    A model trained with LoRA (``policy.lora`` / ``value.lora``) is written twice: merged (the directories above,
    plain HF models) and its adapter alone in PEFT's format (``policy-adapter``, ``critic-adapter``: the
    backbone's adapter; the critic's head is in ``critic``), in float32. When the base is not a directory (a tiny
    model built from its config) it is written too (``policy-base``, ``critic-base``), so the adapter has a base to
    load on."""
    cfg, tokenizer, models = checkpoint_models(checkpoint_dir, overrides=overrides)
    loras = {"policy": cfg.policy.lora, "value": cfg.value.lora}
    bases = {"policy": cfg.policy_init_path, "value": cfg.value_init_path}
    sources = _dtype_sources(resolve_step_dir(checkpoint_dir), cfg)
    written = []
    for role, model in models.items():
        name = "policy" if role == "policy" else "critic"
        target = Path(out_dir) / name
        dtype = getattr(torch, stored_dtype(sources[role]) if cfg.export.dtype == "auto" else cfg.export.dtype)
        exported = merged_copy(model)
        if isinstance(exported, ValueModel):
            exported.save_pretrained(target, dtype=dtype)
        else:  # the export's own copy (merged, or rebuilt from the checkpoint): cast in place
            exported.to(dtype).save_pretrained(target)
        tokenizer.save_pretrained(target)
        written.append(target)
        if loras[role].enabled:
            written += _write_adapter(model, loras[role], Path(out_dir), name, bases[role], tokenizer)
    return written


def _dtype_sources(step_dir: Path, cfg: config_lib.Config) -> dict[str, Path | str | None]:
    """Where each role's source dtype is read (``export.dtype: auto``): the checkpoint's description, or for a
    checkpoint written before it had one, the directories its config names (None: a tiny model, float32)."""
    hf_dir = step_dir / checkpoint.HF_DIR
    if described(hf_dir):
        return {"policy": hf_dir / POLICY, "value": hf_dir / CRITIC}
    return {"policy": cfg.policy_init_path, "value": cfg.value_init_path}


def checkpoint_models(
    checkpoint_dir: str | Path, local: bool = False, overrides: tuple[str, ...] = ()
) -> tuple[config_lib.Config, object, dict]:
    """(the run's config, its tokenizer, ``{"policy": causal LM, "value": ValueModel}``) with a checkpoint's weights
    (its latest ``step_N`` when given the directory holding them), adapters included; no critic for a GRPO run.
    ``local``: read in this process alone, outside any collective (a rank warm-starting its critic). ``overrides``:
    ``export.*`` keys set over the checkpoint's config (the other sections describe how the weights were made).

    The models are rebuilt from the checkpoint's own ``hf/`` (configs and tokenizer); a checkpoint written before
    it had one is rebuilt from the directories its config names, which must then still exist."""
    step_dir = resolve_step_dir(checkpoint_dir)
    checkpoint.verify(step_dir)
    cfg = config_lib.from_dict(config_lib.apply_overrides(checkpoint.read_config(step_dir), _export_keys(overrides)))
    hf_dir = step_dir / checkpoint.HF_DIR
    if described(hf_dir):
        tokenizer, policy, backbone = build_described(hf_dir)
    else:
        tokenizer, policy, backbone = _build_from_sources(cfg)
    for model, lora in ((policy, cfg.policy.lora), (backbone, cfg.value.lora)):
        if model is not None and lora.enabled:
            add_adapters(model, lora, cfg.ppo.seed)
    models = {"policy": policy}
    if backbone is not None:
        models["value"] = ValueModel(backbone, shift=cfg.value.shift_values)
    # Consolidates the shards of any layout into these whole models (weights only, no optimizer state).
    ties = {role: tied_names(model) for role, model in models.items()}
    weights = {role: {"model": untied(model.state_dict(), ties[role])} for role, model in models.items()}
    checkpoint.load(step_dir, weights, local=local)
    for role, model in models.items():
        state = weights[role]["model"]
        model.load_state_dict(state | {alias: state[first] for alias, first in ties[role].items()})
    return cfg, tokenizer, models


def _export_keys(overrides: tuple[str, ...]) -> tuple[str, ...]:
    """``overrides`` when each sets an ``export.*`` key; else ConfigError naming the first other key."""
    for item in overrides:
        if not item.startswith("export."):
            raise config_lib.ConfigError(
                f"{item.partition('=')[0]}: dtppo export takes export.* keys only (the checkpoint's config holds "
                f"the rest)"
            )
    return overrides


def merged_copy(model):
    """The model with its adapters merged (itself without adapters): a causal LM, or a ValueModel around its merged
    backbone."""
    if isinstance(model, ValueModel):
        return ValueModel(merged_model(model.backbone), shift=model.shift, head=(model.score.weight, model.score.bias))
    return merged_model(model)


def _write_adapter(model, lora: LoraConfig, out_dir: Path, name: str, base: str | None, tokenizer) -> list[Path]:
    """``out_dir/<name>-adapter`` (PEFT's format), plus ``<name>-base`` when the base is no directory to point at."""
    adapted = model.backbone if isinstance(model, ValueModel) else model
    written = []
    if base is None or not Path(base).is_dir():
        base_dir = out_dir / f"{name}-base"
        frozen_base(adapted).save_pretrained(base_dir)
        tokenizer.save_pretrained(base_dir)
        written.append(base_dir)
        base = str(base_dir.resolve())
    written.append(save_adapter(adapted, lora, out_dir / f"{name}-adapter", base))
    return written


def _build_from_sources(cfg: config_lib.Config) -> tuple:
    """(tokenizer, policy, critic backbone or None) from the model directories (or tiny shapes) ``cfg`` names."""
    tokenizer = load_tokenizer(cfg.policy_init_path)
    policy = build_policy(cfg.policy_init_path, cfg.policy.model.tiny, cfg.ppo.seed, tokenizer)
    backbone = None
    if cfg.has_critic:
        tiny = tiny_qwen2_config(cfg.value.model.tiny, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
        backbone = build_backbone(cfg.value_init_path, tiny, cfg.ppo.seed)
    return tokenizer, policy, backbone
