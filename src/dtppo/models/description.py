"""What a checkpoint says about its models besides their weights: each role's HF config, the policy's generation
config and the tokenizer, so ``dtppo export`` rebuilds the models from the checkpoint alone.

Written as files (JSON and the tokenizer's own files, nothing pickled) under ``step_N/hf/``: ``policy/`` holds
``config.json``, ``generation_config.json`` and the tokenizer; ``critic/`` the critic backbone's ``config.json``.
Each config.json names the dtype of the directory its model was loaded from (models train in float32), which
``export.dtype: auto`` writes.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from dtppo.config import ModelConfig
from dtppo.models.causal_lm import tiny_qwen2_config
from dtppo.models.loading import loading_from
from dtppo.models.tokenizer import load_tokenizer

POLICY, CRITIC = "policy", "critic"
EXPORT_DTYPES = ("float32", "bfloat16", "float16")


def describe_models(
    policy: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, policy_path: str | None, critic: ModelConfig | None
) -> dict[str, bytes]:
    """{path relative to ``hf/``: bytes} for a run whose policy is ``policy`` (its config and generation config
    as built, loaded from ``policy_path``) and whose critic, if it has one, starts from ``critic`` (its backbone's
    directory, ``Config.value_init_path``, or its tiny shape)."""
    with tempfile.TemporaryDirectory(prefix="dtppo-describe-") as directory:
        root = Path(directory)
        # The loaded policy's config says float32 (what it trains in); the description keeps its source's dtype.
        policy_config = copy.deepcopy(policy.config)
        policy_config.dtype = stored_dtype(policy_path)
        policy_config.save_pretrained(root / POLICY)
        policy.generation_config.save_pretrained(root / POLICY)
        tokenizer.save_pretrained(root / POLICY)
        if critic is not None:
            critic_config(critic, tokenizer).save_pretrained(root / CRITIC)
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def critic_config(critic: ModelConfig, tokenizer: PreTrainedTokenizerBase):
    """The config the critic's backbone is built from (``workers.value``): its starting directory's, or the tiny one."""
    if critic.path is None:
        return tiny_qwen2_config(critic.tiny, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
    with loading_from(critic.path):
        return AutoConfig.from_pretrained(critic.path)


def stored_dtype(path: str | Path | None) -> str:
    """The dtype a model directory's weights are stored in, as its config.json names it (``dtype``, or
    ``torch_dtype`` as written before transformers 5): ``float32`` for no directory (a model built from its config),
    none named, or a dtype other than float32, bfloat16 and float16."""
    if path is None:
        return "float32"
    with loading_from(str(path)):
        named = AutoConfig.from_pretrained(path).dtype
    name = str(named).removeprefix("torch.") if named is not None else "float32"
    return name if name in EXPORT_DTYPES else "float32"


def described(hf_dir: Path) -> bool:
    return (hf_dir / POLICY / "config.json").is_file()


def build_described(hf_dir: Path) -> tuple[PreTrainedTokenizerBase, PreTrainedModel, PreTrainedModel | None]:
    """(tokenizer, policy, critic backbone or None) from a checkpoint's ``hf/``, randomly initialised in fp32
    (the weights are loaded next)."""
    policy_dir, critic_dir = hf_dir / POLICY, hf_dir / CRITIC
    with loading_from(str(policy_dir)):
        policy = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(policy_dir), dtype=torch.float32)
        policy.generation_config = GenerationConfig.from_pretrained(policy_dir)
    backbone = None
    if (critic_dir / "config.json").is_file():
        with loading_from(str(critic_dir)):
            backbone = AutoModel.from_config(AutoConfig.from_pretrained(critic_dir), dtype=torch.float32)
    return load_tokenizer(str(policy_dir)), policy, backbone
