"""The test hooks that provoke faults on purpose (``dtppo.faults``): each does nothing when its variable is unset,
reads its variable when used (so a test can set it after import), and refuses a value it does not know."""

import pytest
import torch

from dtppo import faults


@pytest.fixture(autouse=True)
def _unset(monkeypatch):
    for name in (
        faults.NONFINITE_ENV,
        faults.PAUSE_ENV,
        faults.VALUE_GRAD_ENV,
        faults.GEN_LOGPROB_ERROR_ENV,
        faults.OBSERVATIONS_AS_ACTIONS_ENV,
        faults.LEARNING_FAULT_ENV,
    ):
        monkeypatch.delenv(name, raising=False)


def test_unset_hooks_do_nothing():
    assert not faults.nonfinite_injected("policy", 0)
    assert faults.value_grad_scale() == 1.0 and faults.gen_logprob_error(4) is None
    assert not faults.observations_as_actions() and faults.learning_fault() == ""
    faults.pause_in_checkpoint()  # returns at once


def test_nonfinite_steps_are_listed_per_model(monkeypatch):
    monkeypatch.setenv(faults.NONFINITE_ENV, "policy:3, 4; value:0")
    assert [faults.nonfinite_injected("policy", s) for s in range(6)] == [False, False, False, True, True, False]
    assert faults.nonfinite_injected("value", 0) and not faults.nonfinite_injected("value", 3)
    assert not faults.nonfinite_injected("critic", 0)  # only the models named


@pytest.mark.parametrize("spec, scale", [("off", 0.0), ("flip", -1.0), (" ", 1.0)])
def test_the_critics_gradient_factor(spec, scale, monkeypatch):
    monkeypatch.setenv(faults.VALUE_GRAD_ENV, spec)
    assert faults.value_grad_scale() == scale


def test_the_generation_log_prob_error_grows_with_the_sample_index_mod_3(monkeypatch):
    monkeypatch.setenv(faults.GEN_LOGPROB_ERROR_ENV, "0.25")
    assert torch.equal(faults.gen_logprob_error(5), torch.tensor([0.0, 0.25, 0.5, 0.0, 0.25]))


def test_observations_as_actions_only_for_1(monkeypatch):
    monkeypatch.setenv(faults.OBSERVATIONS_AS_ACTIONS_ENV, "1")
    assert faults.observations_as_actions()
    monkeypatch.setenv(faults.OBSERVATIONS_AS_ACTIONS_ENV, "yes")
    assert not faults.observations_as_actions()


def test_the_checkpoint_pause_sleeps_its_seconds(monkeypatch):
    slept = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    monkeypatch.setenv(faults.PAUSE_ENV, "0.5")
    faults.pause_in_checkpoint()
    monkeypatch.setenv(faults.PAUSE_ENV, "0")
    faults.pause_in_checkpoint()
    assert slept == [0.5]


@pytest.mark.parametrize(
    "variable, read",
    [(faults.VALUE_GRAD_ENV, faults.value_grad_scale), (faults.LEARNING_FAULT_ENV, faults.learning_fault)],
)
def test_an_unknown_value_is_refused_naming_the_variable(variable, read, monkeypatch):
    monkeypatch.setenv(variable, "sideways")
    with pytest.raises(ValueError, match=f"{variable} must be .*got 'sideways'"):
        read()
