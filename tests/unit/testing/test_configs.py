"""Tiny configs for tests and benchmarks (``dtppo.testing.configs``): the checkout's tiny recipe with overrides,
checked as the CLI checks it, and the workers' config at the small model's size."""

import pytest

from dtppo import config as config_lib
from dtppo.testing.configs import SMALL_MODEL, TINY_RECIPE, make_config, tiny_config


def test_the_tiny_recipe_is_the_checkouts_and_loads_with_overrides():
    assert TINY_RECIPE.is_file() and TINY_RECIPE.parent.name == "recipes"
    cfg = tiny_config("ppo.seed=11")
    assert cfg.ppo.seed == 11 and cfg == config_lib.load(TINY_RECIPE, ["ppo.seed=11"])
    with pytest.raises(config_lib.ConfigError, match="ppo.no_such_key"):
        tiny_config("ppo.no_such_key=1")


def test_the_workers_config_is_the_small_model_trained_as_one_batch_of_8():
    cfg = make_config(["ppo.seed=5"])
    assert cfg.ppo.seed == 5 and not cfg.ppo.init_from_sft and cfg.ppo.num_prompts_per_step == 8
    for section in (cfg.policy, cfg.value):
        assert (section.model.tiny.hidden_size, section.model.tiny.num_layers) == (64, 2)
        assert section.train_global_batch_size == 8 and section.optimizer.eps == 1e-6
    assert len(SMALL_MODEL) == 10
