"""Tiny configs: the checkout's tiny recipe with overrides, a smaller model for both roles, and the workers' config
that compares one process with several ranks."""

from __future__ import annotations

from pathlib import Path

from dtppo import config as config_lib

# The recipes are the checkout's (recipes/ beside src/), not part of the installed package.
TINY_RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "tiny-math-cpu.yaml"

# A smaller random-init model for both roles (4 query and 2 key-value heads, as base.yaml's).
SMALL_MODEL = [
    f"{w}.model.tiny.{k}={v}"
    for w in ("policy", "value")
    for k, v in [
        ("hidden_size", 64),
        ("num_layers", 2),
        ("num_heads", 4),
        ("num_kv_heads", 2),
        ("intermediate_size", 128),
    ]
]


def tiny_config(*overrides: str) -> config_lib.Config:
    """The tiny recipe with ``overrides`` (``section.key=value``), loaded and checked as the CLI loads it."""
    return config_lib.load(TINY_RECIPE, list(overrides))


def make_config(overrides: list[str]) -> config_lib.Config:
    """The tiny recipe at :data:`SMALL_MODEL`'s size, 8 prompts a step trained as one global batch of 8."""
    # Adam's first step is lr·g/(|g| + eps): with eps = 1e-8 a gradient entry of ~1e-9 turns float
    # round-off (summation order differs under TP) into a full lr-sized step. eps = 1e-6 keeps the weight
    # comparison about the sharding, not about that amplification.
    eps = ["policy.optimizer.eps=1e-6", "value.optimizer.eps=1e-6"]
    base = [
        *eps,
        "ppo.init_from_sft=false",
        "ppo.num_prompts_per_step=8",
        "logger.tensorboard=false",
        "policy.train_global_batch_size=8",
        "value.train_global_batch_size=8",
        *SMALL_MODEL,
    ]
    return tiny_config(*base, *overrides)
