"""The repository, the tiny recipe the tests run (``dtppo.testing.configs``), and the overrides they share."""

from pathlib import Path

from dtppo.testing.configs import SMALL_MODEL, TINY_RECIPE, tiny_config

__all__ = ["FAST", "RANDOM_START", "REPO", "SMALL_MODEL", "TINY", "tiny_config"]

REPO = Path(__file__).resolve().parents[2]
TINY = str(TINY_RECIPE)

# Small, fast settings shared by the functional tests (the learning test sets its own; a test that needs other
# values lists them after these: the later override wins).
FAST = [
    "ppo.num_prompts_per_step=16",
    "ppo.validation.max_samples=32",
    "ppo.validation.batch_size=32",
    "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=4",
    "value.train_global_batch_size=8",
    "value.train_micro_batch_size=4",
    "logger.tensorboard=false",
]

# `make test`'s PPO runs start from the tiny recipe's random policy instead of an SFT model (the slow tier's share one,
# the ``sft_dir`` fixture): what they check holds for any start, and the SFT would cost ~20 s of the tier.
RANDOM_START = ["ppo.init_from_sft=false"]
