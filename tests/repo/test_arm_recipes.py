"""The long-chain experiment's recipes (one per arm, recipes/tiny-chain-*-cpu.yaml) are the arms its spec runs
(bench/learning/critic_step_rewards.py): a recipe that drifts from its arm fails here."""

import pytest

from bench.learning.critic_step_rewards import ARMS, SPECS
from dtppo import config as config_lib
from tests.support.recipes import REPO

RECIPES = {
    "a_critic_outcome": "tiny-chain-critic-outcome-cpu.yaml",
    "b_critic_steps": "tiny-chain-critic-steps-cpu.yaml",
    "c_critic_steps_long": "tiny-chain-critic-steps-long-cpu.yaml",
    "d_grpo_outcome": "tiny-chain-grpo-outcome-cpu.yaml",
    "e_grpo_process": "tiny-chain-grpo-process-cpu.yaml",
}


@pytest.mark.parametrize("arm", sorted(RECIPES))
def test_each_arm_has_its_recipe(arm):
    spec = REPO / SPECS["critic_step_rewards"].recipe
    assert config_lib.load(REPO / "recipes" / RECIPES[arm]) == config_lib.load(spec, ARMS[arm])


def test_the_check_tells_the_arms_apart():
    spec = REPO / SPECS["critic_step_rewards"].recipe
    loaded = {arm: config_lib.load(REPO / "recipes" / recipe) for arm, recipe in RECIPES.items()}
    assert sorted(RECIPES) == sorted(ARMS)
    for arm in RECIPES:  # the negative control: each recipe differs from every other arm
        assert [other for other in ARMS if config_lib.load(spec, ARMS[other]) == loaded[arm]] == [arm]
