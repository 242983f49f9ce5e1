"""The repository, the tiny recipe the tests run, and the overrides they share."""

from pathlib import Path

from dtppo import config as config_lib

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "recipes" / "tiny-math-cpu.yaml")

# Small, fast settings shared by the functional tests (the learning test sets its own; a test that needs other
# values lists them after these: the later override wins).
FAST = [
    "ppo.num_prompts_per_step=16",
    "ppo.max_val_samples=32",
    "ppo.val_batch_size=32",
    "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=4",
    "value.train_global_batch_size=8",
    "value.train_micro_batch_size=4",
    "logger.tensorboard=false",
]

# `make test`'s PPO runs start from the tiny recipe's random policy instead of an SFT model (the slow tier's share one,
# the ``sft_dir`` fixture): what they check holds for any start, and the SFT would cost ~20 s of the tier.
RANDOM_START = ["ppo.init_from_sft=false"]

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
    return config_lib.load(TINY, list(overrides))
