"""The reward breakdown of a batch (``dtppo.rewards.rewarder``): concatenated and selected by rows, each part's mean
over the samples it scored, failed chunks counted, and the columns reward functions get. Scoring itself:
tests/unit/rewards/test_scoring.py and test_functions.py."""

from dataclasses import replace

import torch

from dtppo.config import RewardConfig
from dtppo.data.problem import Problem
from dtppo.rewards.failures import ChunkFailure
from dtppo.rewards.rewarder import (
    RewardBreakdown,
    Rewarder,
    concat_breakdowns,
    failure_counts,
    reward_columns,
    weighted_parts,
)


def test_reward_breakdowns_concatenate_and_select_rows():
    failed = torch.tensor([False, False, True])
    a = RewardBreakdown(
        torch.tensor([1.0, 0.0]), [(), ()], {"acc": [1.0, 0.0], "fmt": [None, 1.0]}, failed[:2], _counts(1, 0)
    )
    b = RewardBreakdown(torch.tensor([0.0]), [()], {"acc": [None], "fmt": [None]}, failed[2:], _counts(0, 1))
    both = concat_breakdowns([a, b])
    assert both.total.tolist() == [1.0, 0.0, 0.0] and both.failed.tolist() == failed.tolist()
    kept = both.take([1, 2])
    assert kept.failed.tolist() == [False, True]
    # a failed sample is in no part's mean; the counts stay the whole batch's
    assert kept.means() == {"acc": 0.0, "fmt": 1.0} | _counts(1, 1)


def _counts(timed_out: int, crashed: int) -> dict[str, int]:
    return {
        "crashed_chunks": crashed,
        "timed_out_chunks": timed_out,
        "raised_chunks": 0,
        "out_of_memory_chunks": 0,
        "failed_samples": timed_out + crashed,
    }


def test_reward_columns_carry_every_column_and_the_reference_as_answer():
    problems = [
        Problem("q", "", "7", {"question": "q", "answer": "full #### 7", "x": 1}),
        Problem("r", "", "8", {"question": "r", "answer": "full #### 8"}),
    ]
    columns = reward_columns(problems)
    assert columns == {"question": ["q", "r"], "answer": ["7", "8"], "x": [1, None]}


def test_a_breakdown_with_no_scored_sample_has_no_part_means():
    failed = torch.tensor([True, True])
    counts = {"crashed_chunks": 1, "timed_out_chunks": 0, "raised_chunks": 0, "out_of_memory_chunks": 0}
    nothing = RewardBreakdown(torch.zeros(2), [(), ()], {"acc": [None, None]}, failed, counts | {"failed_samples": 2})
    assert nothing.means() == counts | {"failed_samples": 2}


def test_failure_counts_are_per_kind_with_every_kind_present():
    failures = [ChunkFailure("crashed", "f", "exit 3", 0, 4, "q"), ChunkFailure("crashed", "f", "exit 3", 4, 4, "q")]
    failures.append(ChunkFailure("timed_out", "g", "30 s", 8, 2, "q"))
    assert failure_counts(failures, 10) == _counts(1, 2) | {"failed_samples": 10}
    assert failure_counts([], 0) == _counts(0, 0)


def test_a_zero_weight_parts_steps_are_logged_not_placed():
    # a function at weight 0 is scored for its metric only: its steps must not become steps (GRPO would switch to
    # process supervision and count them)
    steps = [((3, 1.0), (7, 0.5)), ()]
    outcome, placed = weighted_parts([(1.0, [1.0, 0.0]), (0.0, steps)], [False, False])
    assert outcome.tolist() == [1.0, 0.0] and placed == [(), ()]
    _, weighted = weighted_parts([(1.0, [1.0, 0.0]), (2.0, steps)], [False, False])
    assert weighted == [((3, 2.0), (7, 1.0)), ()]  # the control: a weight makes them steps


def test_the_rewarder_says_whether_its_last_batch_had_steps():
    """What the reward phase reads to measure the next batch's tokens while it is scored: a batch with a step, then
    one whose functions found none (a weight-0 part's steps are no steps)."""
    reward = RewardConfig(functions=("gsm8k", "arithmetic_steps"), weights=(1.0, 0.5), num_workers=0)
    rewarder = Rewarder(reward, system_prompt=None, backend="local", device=None)
    problem = Problem(question="q", solution="", answer="3")
    assert not rewarder.gave_steps
    rewarder.score([problem], ["1+2=3\n#### 3"])
    assert rewarder.gave_steps
    rewarder.score([problem], ["#### 3"])
    assert not rewarder.gave_steps
    unweighted = Rewarder(replace(reward, weights=(1.0, 0.0)), system_prompt=None, backend="local", device=None)
    unweighted.score([problem], ["1+2=3\n#### 3"])
    assert not unweighted.gave_steps
