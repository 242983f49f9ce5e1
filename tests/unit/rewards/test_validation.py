"""Validation's figures (``dtppo.rewards.validation``): the verifier's mean as the accuracy, the mean total reward
over the responses that were scored (NaN when none was), each part's mean, the mean length, and each problem's
sample."""

import math

import torch

from dtppo.data.problem import Problem
from dtppo.rewards.validation import eval_result

PROBLEMS = [Problem("Q1", "", "1"), Problem([{"role": "user", "content": "Q2"}], "", "2"), Problem("Q3", "", None)]


def test_the_figures_of_a_scored_validation():
    total = torch.tensor([1.0, 0.0, 0.5])
    result = eval_result(PROBLEMS, ["1", "3", "x"], [2, 4, 9], total, {"gsm8k": 0.5, "len": 0.25}, "gsm8k")
    assert result.accuracy == 0.5 and result.reward == 0.5 and result.rewards == {"gsm8k": 0.5, "len": 0.25}
    assert result.avg_length == 5.0
    assert result.samples[1] == ([{"role": "user", "content": "Q2"}], "3", "2", 0.0)
    assert result.samples[2] == ("Q3", "x", None, 0.5)


def test_a_task_without_a_verifier_has_no_accuracy():
    result = eval_result(PROBLEMS[:1], ["1"], [1], torch.tensor([0.75]), {"mine": 0.75}, None)
    assert result.accuracy is None and result.reward == 0.75


def test_failed_responses_leave_the_mean_reward_and_none_scored_is_nan():
    total = torch.tensor([1.0, 0.0, 0.5])
    failed = torch.tensor([False, True, False])
    assert eval_result(PROBLEMS, ["a", "b", "c"], [1, 1, 1], total, {}, None, failed).reward == 0.75
    nothing = eval_result(PROBLEMS, ["a", "b", "c"], [1, 1, 1], total, {}, None, torch.ones(3, dtype=torch.bool))
    assert math.isnan(nothing.reward)
    # the samples keep every response, failed or not (their reward is the 0 they were given)
    assert [s[3] for s in nothing.samples] == [1.0, 0.0, 0.5]
