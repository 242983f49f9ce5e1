"""The critic's warmup gate (``dtppo.ppo.critic_warmup``): a fixed number of critic-only steps, or until the mean
explained variance over a window reaches a bound (capped), its metrics, and its state across a resume."""

import math

import pytest

from dtppo import config as config_lib
from dtppo.config import WarmupConfig
from dtppo.ppo.critic_warmup import CriticWarmup


def _warmup(**warmup):
    return CriticWarmup(WarmupConfig(**warmup))


def test_fixed_warmup_counts_its_critic_only_steps():
    warmup = CriticWarmup(WarmupConfig(steps=2))
    assert [warmup.policy_trains(step, None) for step in range(4)] == [False, False, True, True]
    assert [warmup.metrics(s)["train/critic/warmup_steps"] for s in range(4)] == [1, 2, 2, 2]


def test_ev_gate_opens_on_the_window_mean_skipping_undefined_steps():
    warmup = _warmup(until_ev=0.5, ev_window=2, max_steps=10)
    evs = [-0.4, 0.3, None, 0.6, 0.5, 0.1]  # window means: −, −0.05, (skipped), 0.45, 0.55 -> opens at step 4
    trains = [warmup.policy_trains(step, ev) for step, ev in enumerate(evs)]
    assert trains == [False, False, False, False, True, True]
    assert warmup.metrics(5) == {"train/critic/warmup_steps": 4.0, "train/critic/warmup_window_ev": 0.55}
    assert math.isclose(warmup.window_ev(), 0.55)


def test_ev_gate_is_capped_and_resumes_from_its_state():
    warmup = _warmup(until_ev=0.9, ev_window=3, max_steps=3)
    assert [warmup.policy_trains(step, 0.2) for step in range(5)] == [False, False, False, True, True]
    assert warmup.metrics(4)["train/critic/warmup_steps"] == 3.0
    # a resume mid-warmup continues the window: the state holds the EVs seen so far
    first = _warmup(until_ev=0.5, ev_window=2)
    first.policy_trains(0, 0.4)
    resumed = _warmup(until_ev=0.5, ev_window=2)
    resumed.load_state_dict(first.state_dict())
    assert resumed.policy_trains(1, 0.7) and not _warmup(until_ev=0.5, ev_window=2).policy_trains(1, 0.7)


def test_a_fixed_warmup_and_an_ev_gate_together_are_refused_naming_the_key():
    with pytest.raises(config_lib.ConfigError, match=r"value\.warmup\.steps"):
        config_lib.from_dict({"value": {"warmup": {"until_ev": 0.3, "steps": 5}}})
