"""What an environment is and calling one safely (``dtppo.envs.interface``), in this process: the row ``reset`` gets,
loading the class a spec names, a job run on it with every failure turned into a message naming the environment and
the sample, and the check of what ``step`` returns. Over environment processes: tests/unit/envs/test_client.py."""

import math
import re

import numpy as np
import pytest

from dtppo.data.problem import Problem
from dtppo.envs.interface import EnvironmentFailure, checked_step, episode_row, load_environment, run_job
from tests.support.recipes import REPO

ENV = str(REPO / "tests" / "support" / "scripted_env.py")


def test_reset_gets_the_prompt_the_columns_and_the_reference():
    assert episode_row(Problem("Q", "", "7", {"level": 2})) == {"prompt": "Q", "level": 2, "answer": "7"}
    assert episode_row(Problem("Q", "", None)) == {"prompt": "Q"}  # a task without a reference has no answer


def test_checked_step_accepts_what_the_interface_allows():
    assert checked_step((None, 1, True)) == (None, 1.0, True)
    assert checked_step(([{"role": "tool", "content": "4"}], 0.0, False))[2] is False
    for bad in [(1, 0.0, True), ("x", True, True), ("x", 0.0, "yes"), ([{"role": "tool"}], 0.0, False)]:
        with pytest.raises(ValueError):
            checked_step(bad)
    assert checked_step(("x", np.float32(0.5), np.bool_(False))) == ("x", 0.5, False)  # numpy's scalars too
    for bad in [("x", math.inf, True), ("x", 0.0), ["x", 0.0, True]]:
        with pytest.raises(ValueError):
            checked_step(bad)


def test_a_spec_loads_the_class_built_with_its_kwargs():
    env = load_environment(f"{ENV}:Scripted", {"reward_per_call": 0.25})
    assert env.reward_per_call == 0.25
    with pytest.raises(EnvironmentFailure, match="building it with {} raised RuntimeError: no license"):
        load_environment(f"{ENV}:BadInit", {})
    with pytest.raises(EnvironmentFailure, match=r"has no 'Missing'"):
        load_environment(f"{ENV}:Missing", {})
    with pytest.raises(EnvironmentFailure, match=r"has no reset\(\) method"):
        load_environment("collections:OrderedDict", {})


def test_a_job_resets_and_steps_and_returns_each_samples_state_and_answer():
    spec = f"{ENV}:Scripted"
    env = load_environment(spec, {})
    kind, states = run_job(spec, env, ("reset", [4, 5], [{"prompt": "a"}, {"prompt": "b"}]))
    assert kind == "ok" and states == [{"calls": 0, "row": {"prompt": "a"}}, {"calls": 0, "row": {"prompt": "b"}}]
    kind, out = run_job(spec, env, ("step", [4, 5], states, ["<calc>2*3</calc>", "#### 6"]))
    assert kind == "ok"
    assert out[0] == ({"calls": 1, "row": {"prompt": "a"}}, "<result>6</result>\n", 0.5, False)
    assert out[1][1:] == (None, 1.0, True)


@pytest.mark.parametrize(
    "name, message",
    [
        ("Raises", r"Raises'?: step raised KeyError: 'no tool' \(sample 9\)"),
        ("BadReturn", r"step returned \('obs', 1.0\), not a tuple .*\(sample 9, after '<calc>1\+1</calc>'\)"),
    ],
)
def test_a_failing_job_is_an_error_message_naming_the_environment_and_the_sample(name, message):
    spec = f"{ENV}:{name}"
    env = load_environment(spec, {})
    kind, text = run_job(spec, env, ("step", [9], [{}], ["<calc>1+1</calc>"]))
    assert kind == "error" and "\n" not in text
    assert re.search(message, text)
