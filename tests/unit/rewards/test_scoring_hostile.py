"""The hostile-completion catalogue (tests/support/hostile_catalogue.py) against the reward and the scoring pool.

Every case must score exactly its expected value (0.0, or 1.0 where the completion's final answer is
right under the reward contract), in bounded time, in this process and through the scoring pool; and
10,000 scorings through the pool must stay within a fixed memory bound.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from dtppo.config import RewardConfig
from dtppo.rewards.scoring import RewardScorer
from dtppo.rewards.verifiers.gsm8k import gsm8k_reward
from tests.support.hostile_catalogue import catalogue

CASES = catalogue()
SCORING_BOUND_S = 0.5  # one in-process scoring; the measured worst is ~0.05 s on 2 busy cores
POOL = RewardConfig(num_workers=2, timeout_s=20.0)  # a whole batch, 10k scorings included
PARALLEL_SCORINGS = 10_000
WORKER_GROWTH_MIB = 32.0  # peak RSS growth of each scoring process over its idle size
PARENT_GROWTH_MIB = 64.0  # peak RSS growth of the process that calls score()


def _gsm8k(scorer: RewardScorer, responses: list, truths: list) -> list[float]:
    scored = scorer.score([None] * len(responses), responses, {"answer": truths})
    assert scored.failures == []  # every chunk was scored in time, so a 0.0 here is a verdict
    return scored.scores[0]


def _as_reward_function(case) -> float:
    """The expected score through the ``gsm8k`` reward function, which reads a numeric reference (a jsonl
    ``"answer": 42``) as its text (``functions.reference_text``); ``gsm8k_reward`` itself scores a non-string 0."""
    numeric = isinstance(case.truth, (int, float)) and isinstance(case.response, str)
    return 1.0 if numeric and case.response == f"#### {case.truth}" else case.expected


@pytest.fixture(scope="module")
def scorer():
    gsm8k_reward("\\boxed{\\frac{1}{2}}", "0.5")  # math-verify's parser is built on first use: not timed
    scorer = RewardScorer(POOL, backend="local", specs=["gsm8k"])
    scorer.wait_ready()
    yield scorer
    scorer.close()


def test_catalogue_covers_every_class():
    kinds = {c.kind for c in CASES}
    assert len(CASES) >= 200
    assert kinds == {
        "format",
        "power_tower",
        "huge_integer",
        "deep_latex",
        "binary_garbage",
        "megabyte",
        "unicode",
        "invisible",
        "hostile_truth",
        "non_string",
    }
    right = [c for c in CASES if c.expected == 1.0]
    assert len(right) >= 80 and len(CASES) - len(right) >= 200
    assert max(len(c.response) for c in CASES if isinstance(c.response, str)) >= 1_000_000


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_scores_its_value_in_bounded_time(case):
    # The first call of a process may import the parts of sympy a case needs (once, ~0.5 s): the bound is on the
    # call a training run repeats, so the second is timed.
    assert gsm8k_reward(case.response, case.truth) == case.expected
    start = time.perf_counter()
    score = gsm8k_reward(case.response, case.truth)
    elapsed = time.perf_counter() - start
    assert score == case.expected
    assert elapsed < SCORING_BOUND_S, f"{case.name} took {elapsed:.3f} s"


def test_catalogue_through_the_scoring_pool(scorer):
    start = time.monotonic()
    scores = _gsm8k(scorer, [c.response for c in CASES], [c.truth for c in CASES])
    assert time.monotonic() - start < POOL.timeout_s
    assert scores == [_as_reward_function(c) for c in CASES]


def _status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def _reset_peak(pid: int) -> None:
    """Linux: writing 5 to clear_refs resets the process's peak RSS (VmHWM) to its current RSS."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_10k_parallel_scorings_stay_within_a_memory_bound(scorer):
    cycle = [CASES[i % len(CASES)] for i in range(PARALLEL_SCORINGS)]
    responses, truths = [c.response for c in cycle], [c.truth for c in cycle]
    chars = sum(len(r) for r in responses if isinstance(r, str))
    assert chars > 10**9  # ~1 GB of text (874 responses of >= 1 MB): only their tails may travel
    _gsm8k(scorer, responses[:500], truths[:500])  # workers at their working size before the baseline
    workers, parent = scorer.pool.worker_pids, os.getpid()
    assert len(workers) == POOL.num_workers
    for pid in [*workers, parent]:
        _reset_peak(pid)
    baseline = {pid: _status_mib(pid, "VmRSS") for pid in [*workers, parent]}
    start = time.monotonic()
    scores = _gsm8k(scorer, responses, truths)
    elapsed = time.monotonic() - start
    growth = {pid: _status_mib(pid, "VmHWM") - baseline[pid] for pid in baseline}
    assert elapsed < POOL.timeout_s
    assert scores == [_as_reward_function(c) for c in cycle]
    assert scorer.pool.worker_pids == workers  # nothing was restarted: the growth is the workers' own
    print(
        f"\n{PARALLEL_SCORINGS} scorings ({chars / 1e9:.2f} G chars) in {elapsed:.2f} s; peak RSS growth MiB: "
        f"workers {[round(growth[p], 1) for p in workers]} (of {[round(baseline[p]) for p in workers]}), "
        f"caller {growth[parent]:.1f}"
    )
    assert max(growth[p] for p in workers) < WORKER_GROWTH_MIB
    assert growth[parent] < PARENT_GROWTH_MIB
