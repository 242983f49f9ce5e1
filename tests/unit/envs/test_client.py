"""The environment client (``dtppo.envs.client``), in this process and over environment processes (whose loop is
``dtppo.envs.worker``): an environment that fails is one line naming it and the sample, never a hang, never a silent
0; a state changed in place reaches the next step whichever process runs it."""

import time

import pytest

from dtppo.config import EnvConfig
from dtppo.envs.client import EnvClient
from dtppo.envs.interface import EnvironmentFailure
from tests.support.recipes import REPO

ENV = str(REPO / "tests" / "support" / "scripted_env.py")


def _client(name, workers=0, timeout_s=30.0):
    return EnvClient(EnvConfig(class_=f"{ENV}:{name}", num_workers=workers, timeout_s=timeout_s))


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize(
    "name, message",
    [
        ("Raises", r"Raises'?: step raised KeyError: 'no tool' \(sample 11\)"),
        ("BadReturn", r"step returned \('obs', 1.0\), not a tuple \(observation, reward, done\) \(sample 11"),
        ("NanReward", r"step returned reward nan \(float\), not a finite number \(sample 11"),
    ],
)
def test_a_failing_step_names_the_environment_and_the_sample(name, message, workers):
    env = _client(name, workers)
    try:
        states = env.reset([{"prompt": "a"}, {"prompt": "b"}], [10, 11])
        with pytest.raises(EnvironmentFailure, match=message) as err:
            env.step([states[1]], ["<calc>1+1</calc>"], [11])
        assert "\n" not in str(err.value) and name in str(err.value)
    finally:
        env.close()


@pytest.mark.parametrize(
    "name, message",
    [
        ("Hangs", r"Hangs'?: timed out on the step of samples 5..5: no answer within env.timeout_s = 3 s"),
        ("Dies", r"Dies'?: crashed on the step of samples 5..5: its process died twice \(exit code 3\)"),
    ],
)
def test_a_hanging_or_dying_environment_is_cut_off_and_named(name, message):
    env = _client(name, workers=1, timeout_s=3.0)
    try:
        states = env.reset([{}], [5])
        start = time.monotonic()
        with pytest.raises(EnvironmentFailure, match=message):
            env.step(states, ["x"], [5])
        assert time.monotonic() - start < 20
    finally:
        env.close()


def test_a_class_that_cannot_be_built_or_found_is_one_line():
    with pytest.raises(EnvironmentFailure, match="building it with {} raised RuntimeError: no license"):
        _client("BadInit")
    with pytest.raises(EnvironmentFailure, match="has no 'Missing'"):
        _client("Missing")
    with pytest.raises(EnvironmentFailure, match="file not found"):
        EnvClient(EnvConfig(class_="nowhere.py:Env", num_workers=0))


def test_a_state_changed_in_place_reaches_the_next_step_across_processes():
    env = _client("Scripted", workers=2)
    try:
        states = env.reset([{}, {}], [0, 1])
        for _ in range(2):
            answers = env.step(states, ["<calc>1+2</calc>", "<calc>2*2</calc>"], [0, 1])
            states = [a[0] for a in answers]
        assert [s["calls"] for s in states] == [2, 2]
        assert [a[1] for a in answers] == ["<result>3</result>\n", "<result>4</result>\n"]
    finally:
        env.close()
