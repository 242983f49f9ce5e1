"""``dtppo export``: a training checkpoint to HF directories that ``transformers`` loads directly."""

from __future__ import annotations

from pathlib import Path

from dtppo import checkpoint
from dtppo import config as config_lib
from dtppo.faults import InputError
from dtppo.models.causal_lm import build_causal_lm, tiny_qwen2_config
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
    GRPO run (``ppo.advantage_estimator=grpo``) has no critic, so only the policy is written."""
    step_dir = resolve_step_dir(checkpoint_dir)
    cfg = config_lib.from_dict(checkpoint.read_config(step_dir))
    tokenizer = load_tokenizer(cfg.policy_init_path)
    out_dir = Path(out_dir)

    models = {"policy": build_causal_lm(cfg.policy_init_path, cfg.policy.model.tiny, len(tokenizer),
                                        tokenizer.pad_token_id, tokenizer.eos_token_id, cfg.ppo.seed)}
    if cfg.ppo.advantage_estimator == "gae":
        tiny = tiny_qwen2_config(cfg.value.model.tiny, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
        models["value"] = ValueModel(build_backbone(cfg.value_init_path, tiny, cfg.ppo.seed),
                                     shift=cfg.value.shift_values)
    # Consolidates the shards of any layout into these whole models (weights only, no optimizer state).
    weights = {role: {"model": model.state_dict()} for role, model in models.items()}
    checkpoint.load(step_dir, weights)
    written = []
    for role, model in models.items():
        model.load_state_dict(weights[role]["model"])
        target = out_dir / ("policy" if role == "policy" else "critic")
        model.save_pretrained(target)
        tokenizer.save_pretrained(target)
        written.append(target)
    return written
