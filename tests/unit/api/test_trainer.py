"""``dtppo.load_config`` and what ``dtppo.PPOTrainer`` refuses before any compute: errors raised as
``dtppo.errors`` classes carrying the command line's lines, never an exit."""

import threading

import pytest

import dtppo
from dtppo.api import trainer as api_trainer
from dtppo.errors import ConfigError, InputError
from tests.support.recipes import TINY, tiny_config

TWO_RANKS = ["cluster.workers_per_node=2", "ppo.init_from_sft=false"]


def test_the_package_names_are_the_api_s():
    assert dtppo.PPOTrainer is api_trainer.PPOTrainer and dtppo.load_config is api_trainer.load_config
    with pytest.raises(AttributeError, match="no attribute 'Trainer'"):
        dtppo.Trainer  # noqa: B018 (the lookup is the test)


def test_load_config_reads_a_path_or_a_mapping_with_overrides():
    from_path = dtppo.load_config(TINY, ["ppo.max_num_steps=3"])
    from_mapping = dtppo.load_config({"defaults": TINY, "ppo": {"max_num_steps": 3}})
    assert from_path == from_mapping and from_path.ppo.max_num_steps == 3
    assert dtppo.load_config({"ppo": {"max_num_steps": 4}}).ppo.max_num_steps == 4  # the defaults of every key


@pytest.mark.parametrize(
    "recipe, overrides, line",
    [
        (TINY, ["ppo.no_such_key=1"], "ppo.no_such_key: unknown key"),
        (TINY, ["ppo.max_num_steps=many"], "ppo.max_num_steps: expected an integer, got 'many'"),
        (TINY, "ppo.max_num_steps=3", "overrides: expected a list of section.key=value, got the string"),
        ("no/such/recipe.yaml", [], "recipe: file not found: no/such/recipe.yaml"),
        ({"ppo": {"gamma": "high"}}, [], "ppo.gae.gamma"),
    ],
)
def test_a_bad_key_or_value_raises_the_config_error_the_cli_prints(recipe, overrides, line):
    with pytest.raises(ConfigError) as err:  # SystemExit is no Exception: pytest.raises would not catch one
        dtppo.load_config(recipe, overrides)
    assert line in str(err.value) and "\n" not in str(err.value)


def test_the_trainer_takes_a_config_not_a_path():
    with pytest.raises(TypeError, match="config: expected a dtppo Config"):
        dtppo.PPOTrainer(TINY)


def test_step_needs_the_run_in_this_process():
    trainer = dtppo.PPOTrainer(tiny_config(*TWO_RANKS))
    with pytest.raises(
        ConfigError, match=r"^cluster: step\(\) runs the loop in this process, and this run has 2 ranks"
    ):
        trainer.step()
    assert trainer.history == []


def test_a_function_that_cannot_reach_two_ranks_gives_one_line():
    lock = threading.Lock()

    def guarded(completions, **kwargs):
        with lock:
            return [0.0] * len(completions)

    trainer = dtppo.PPOTrainer(tiny_config(*TWO_RANKS), reward_funcs=[guarded])
    with pytest.raises(InputError) as err:
        trainer.train()
    assert str(err.value).startswith("reward function 'guarded' cannot be sent to the 2 ranks (cluster.backend local)")
    assert "\n" not in str(err.value)


def test_a_missing_dataset_is_named_as_the_cli_names_it():
    with pytest.raises(ConfigError, match="^data.train.path: required when data.task is custom"):
        dtppo.PPOTrainer(tiny_config("data.task=custom", "reward.functions=[mine]"), reward_funcs={"mine": len})
