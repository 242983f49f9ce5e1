"""When a run whose reward chunks fail stops (rewards.failures.FailureBudget): always-failing functions stop it within
the documented number of steps, one flaky chunk never does, old failures leave the window, the verdict names the
function and the kind, and the window survives a checkpoint."""

import logging
import re

import pytest

from dtppo.config import RewardConfig
from dtppo.config.rules import ConfigError
from dtppo.rewards.failures import ChunkFailure, FailureBudget

DEFAULTS = RewardConfig()


def _failure(kind="crashed", function="f.py:score", detail="exit code 3", first=0):
    return ChunkFailure(kind, function, detail, first, 4, "Write 1 star")


def _run(budget: FailureBudget, steps: list[tuple[int, int]]) -> list[str | None]:
    """Each step scores (chunks, failed chunks); the verdict after each."""
    verdicts = []
    for chunks, failed in steps:
        budget.record(chunks, [_failure(first=4 * i) for i in range(failed)])
        verdicts.append(budget.end_step())
    return verdicts


def _defaults() -> FailureBudget:
    return FailureBudget(DEFAULTS.max_failed_fraction, DEFAULTS.failure_window)


@pytest.mark.parametrize("chunks", [1, 2, 7])
def test_a_function_that_always_fails_stops_at_step_floor_f_w_plus_1(chunks):
    verdicts = _run(_defaults(), [(chunks, chunks)] * 5)
    assert [v is not None for v in verdicts] == [False, False, True, True, True]  # floor(0.5 · 5) + 1 = 3
    assert "'f.py:score' crashed (its process died: exit code 3)" in verdicts[2]
    assert f"{3 * chunks} of the {3 * chunks} chunks scored in the last 3 step(s) failed" in verdicts[2]


@pytest.mark.parametrize("chunks", [1, 2])
@pytest.mark.parametrize("at", [0, 3, 11])
def test_one_flaky_chunk_never_stops_a_run(chunks, at):
    steps = [(chunks, int(i == at)) for i in range(12)]
    assert _run(_defaults(), steps) == [None] * 12


def test_after_the_last_step_the_window_is_the_steps_that_ran():
    """A 2-step run whose rewards all failed ends with the verdict, not as a success; one flaky chunk still passes."""
    budget = _defaults()
    budget.record(2, [_failure(), _failure(first=4)])
    assert budget.end_step() is None
    budget.record(2, [_failure(), _failure(first=4)])
    assert budget.end_step(last=True) is not None
    assert _stops(_defaults(), [(2, 0)]) == [False]
    flaky = _defaults()
    flaky.record(2, [_failure()])
    assert flaky.end_step(last=True) is None  # 1 of 2 is not more than half


def test_failures_older_than_the_window_are_forgotten():
    budget = FailureBudget(0.5, 4)
    # two bad steps (2 of 2 failed), then good ones: 4 failed of 8 is not more than half; one more bad step in the
    # same window is (6 of 8); after 4 good steps the old failures are gone and one bad step is 2 of 8 again
    assert _run(budget, [(2, 2), (2, 2), (2, 0), (2, 0)]) == [None, None, None, None]
    assert _run(budget, [(2, 0)] * 4 + [(2, 2)]) == [None] * 5
    assert _run(FailureBudget(0.5, 4), [(2, 2), (2, 2), (2, 0), (2, 2)])[-1] is not None


def _stops(budget: FailureBudget, steps: list[tuple[int, int]]) -> list[bool]:
    return [verdict is not None for verdict in _run(budget, steps)]


def test_the_limits_at_their_ends():
    assert _stops(FailureBudget(1.0, 5), [(2, 2)] * 10) == [False] * 10  # 1 = never stop
    assert _stops(FailureBudget(0.0, 5), [(2, 0), (2, 1)]) == [False, True]  # 0 = the first failure stops the run
    # a window of one step: exactly half passes, more than half stops
    assert _stops(FailureBudget(0.5, 1), [(4, 2), (4, 3)]) == [False, True]


def test_the_verdict_names_the_commonest_function_and_kind_with_its_last_detail():
    budget = FailureBudget(0.0, 5)
    budget.record(4, [_failure("raised", "a.py:f", "KeyError: 1"), _failure("timed_out", "b.py:g", "no answer")])
    budget.record(2, [_failure("raised", "a.py:f", "KeyError: 2")])
    verdict = budget.end_step()
    assert verdict.startswith("reward function 'a.py:f' raised KeyError: 2 on 2 chunk(s); 3 of the 6 chunks")
    assert "reward.max_failed_fraction = 0 of reward.failure_window = 5 steps" in verdict


def test_each_kind_is_named_once_per_step(caplog):
    budget = _defaults()
    with caplog.at_level(logging.WARNING, logger="dtppo.rewards.failures"):
        budget.record(3, [_failure(first=0), _failure(first=4), _failure("timed_out", detail="no answer", first=8)])
        budget.record(3, [_failure(first=12)])
        budget.end_step()
        budget.record(1, [_failure(first=0)])
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3  # crashed and timed out in step 1, crashed again in step 2
    assert lines[0] == (
        "reward function 'f.py:score' crashed (its process died: exit code 3) on samples 0..3 (prompt 'Write 1 star'); "
        "its samples leave training"
    )
    assert "timed out (no answer) on samples 8..11" in lines[1]


def test_the_window_round_trips_through_a_checkpoint():
    budget, resumed = _defaults(), _defaults()
    _run(budget, [(2, 2), (2, 2)])
    resumed.load_state_dict(budget.state_dict())
    assert _run(resumed, [(2, 2)])[0] is not None  # the third failing step stops the resumed run, as it would have
    assert _run(_defaults(), [(2, 2)])[0] is None  # negative control: a fresh window forgives it


@pytest.mark.parametrize(
    "override, message",
    [
        ({"max_failed_fraction": 1.5}, "max_failed_fraction: must be in [0, 1]"),
        ({"failure_window": 0}, "failure_window: must be >= 1"),
        ({"memory_limit_mib": 64}, "memory_limit_mib: must be 0 (no limit) or at least 128"),
        ({"max_print_bytes": -1}, "max_print_bytes: must be >= 0"),
    ],
)
def test_bad_limits_are_refused(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        RewardConfig(**override)
