"""``dtppo export``: a training checkpoint to HF directories that ``transformers`` loads directly."""

from __future__ import annotations

from pathlib import Path

from dtppo import checkpoint
from dtppo import config as config_lib
from dtppo.faults import InputError
from dtppo.models.causal_lm import build_policy, tiny_qwen2_config
from dtppo.models.description import build_described, described
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


def export_checkpoint(checkpoint_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Write ``out_dir/policy`` (causal LM) and ``out_dir/critic`` (token classification, num_labels=1); a
    GRPO run (``ppo.advantage_estimator=grpo``) has no critic, so only the policy is written.

    The models are rebuilt from the checkpoint's own ``hf/`` (configs and tokenizer); a checkpoint written before
    it had one is rebuilt from the directories its config names, which must then still exist."""
    step_dir = resolve_step_dir(checkpoint_dir)
    checkpoint.verify(step_dir)
    cfg = config_lib.from_dict(checkpoint.read_config(step_dir))
    hf_dir = step_dir / checkpoint.HF_DIR
    if described(hf_dir):
        tokenizer, policy, backbone = build_described(hf_dir)
    else:
        tokenizer, policy, backbone = _build_from_sources(cfg)
    models = {"policy": policy}
    if backbone is not None:
        models["value"] = ValueModel(backbone, shift=cfg.value.shift_values)
    # Consolidates the shards of any layout into these whole models (weights only, no optimizer state).
    ties = {role: tied_names(model) for role, model in models.items()}
    weights = {role: {"model": untied(model.state_dict(), ties[role])} for role, model in models.items()}
    checkpoint.load(step_dir, weights)
    written = []
    for role, model in models.items():
        state = weights[role]["model"]
        model.load_state_dict(state | {alias: state[first] for alias, first in ties[role].items()})
        target = Path(out_dir) / ("policy" if role == "policy" else "critic")
        model.save_pretrained(target)
        tokenizer.save_pretrained(target)
        written.append(target)
    return written


def _build_from_sources(cfg: config_lib.Config) -> tuple:
    """(tokenizer, policy, critic backbone or None) from the model directories (or tiny shapes) ``cfg`` names."""
    tokenizer = load_tokenizer(cfg.policy_init_path)
    policy = build_policy(cfg, tokenizer)
    backbone = None
    if cfg.has_critic:
        tiny = tiny_qwen2_config(cfg.value.model.tiny, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
        backbone = build_backbone(cfg.value_init_path, tiny, cfg.ppo.seed)
    return tokenizer, policy, backbone
