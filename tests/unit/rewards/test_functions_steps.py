"""Step rewards as reward functions return them: a list of ``(end, reward)`` pairs per sample beside TRL's numbers,
checked where the function runs (a bad pair stops the run naming the function and the sample), weighted per
function, and summed into each sample's total (``dtppo.rewards.functions``, ``dtppo.rewards.rewarder``)."""

from __future__ import annotations

import pytest

from dtppo.config import from_dict
from dtppo.data.problem import Problem
from dtppo.rewards import RewardFunctionError
from dtppo.rewards.functions import call_function
from dtppo.rewards.rewarder import Rewarder

PROMPTS, COMPLETIONS = ["p0", "p1", "p2"], ["abc", "", "abcdef"]


def _returning(values):
    return lambda completions, **kwargs: values


def test_numbers_none_and_steps_mix_in_one_batch():
    values = [[(1, 0.5), [3, -1]], None, [(6, 2)]]
    scores = call_function("mixed", _returning(values), PROMPTS, COMPLETIONS, {})
    assert scores == [((1, 0.5), (3, -1.0)), None, ((6, 2.0),)]
    assert all(isinstance(e, int) and isinstance(r, float) for s in (scores[0], scores[2]) for e, r in s)
    assert call_function("plain", _returning([1, 0.0, -2.5]), PROMPTS, COMPLETIONS, {}) == [1.0, 0.0, -2.5]
    assert call_function("none", _returning([[], [], []]), PROMPTS, COMPLETIONS, {}) == [(), (), ()]


def test_a_conversational_completion_is_measured_by_its_text():
    chat = [[{"role": "assistant", "content": "abcd"}]]
    assert call_function("chat", _returning([[(4, 1.0)]]), ["p"], chat, {}) == [((4, 1.0),)]
    with pytest.raises(RewardFunctionError, match=r"a step end 5 outside \(0, 4\]"):
        call_function("chat", _returning([[(5, 1.0)]]), ["p"], chat, {})


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ([(0, 1.0)], "a step end 0 outside (0, 3], the completion's characters"),
        ([(4, 1.0)], "a step end 4 outside (0, 3], the completion's characters"),
        ([(-1, 1.0)], "a step end -1 outside (0, 3], the completion's characters"),
        ([(2.0, 1.0)], "a step end 2.0 (float), not an integer"),
        ([(True, 1.0)], "a step end True (bool), not an integer"),
        ([(2, float("nan"))], "a step reward nan, not a finite number"),
        ([(2, float("inf"))], "a step reward inf, not a finite number"),
        ([(2, "1")], "a step reward '1', not a finite number"),
        ([(2, 1.0, 3)], "a step (2, 1.0, 3), not an (end, reward) pair"),
        ([3], "a step 3, not an (end, reward) pair"),
    ],
)
def test_a_bad_step_is_one_line_naming_the_function_and_the_sample(value, problem):
    values = [value, None, None]
    with pytest.raises(RewardFunctionError) as err:
        call_function("steps_fn", _returning(values), PROMPTS, COMPLETIONS, {}, offset=7)
    message = str(err.value)
    assert message == f"reward function 'steps_fn' returned {problem} for sample 7 (prompt 'p0')"
    assert "\n" not in message and err.value.exit_code == 2


STEP_FILE = """
def steps(completions, **kwargs):
    return [[(1, 1.0), (len(c), 0.5)] if c else [] for c in completions]

def outcome(completions, **kwargs):
    return [float(len(c)) for c in completions]
"""


def test_weights_apply_to_steps_and_the_total_adds_outcome_and_steps(tmp_path):
    path = tmp_path / "step_rewards.py"
    path.write_text(STEP_FILE)
    cfg = from_dict(
        {
            "data": {"task": "custom", "train": {"path": "t"}, "validation": {"path": "v"}},
            "reward": {"functions": [f"{path}:steps", f"{path}:outcome"], "weights": [2.0, 0.5], "num_workers": 0},
        }
    )
    rewarder = Rewarder(cfg.reward, None, cfg.cluster.backend, device=None)
    problems = [Problem(question=f"q{i}", solution="", answer=None) for i in range(3)]
    scored = rewarder.score(problems, ["ab", "", "abcd"])
    assert scored.steps == [((1, 2.0), (2, 1.0)), (), ((1, 2.0), (4, 1.0))]
    assert scored.outcome.tolist() == [1.0, 0.0, 2.0]
    assert scored.total.tolist() == [4.0, 0.0, 5.0]
    assert scored.means() == pytest.approx(
        {"steps": (1.5 + 0.0 + 1.5) / 3, "outcome": 2.0, **{k: 0.0 for k in scored.failures}}
    )
    taken = scored.take([2, 0])
    assert taken.steps == [scored.steps[2], scored.steps[0]] and taken.total.tolist() == [5.0, 4.0]


def test_the_built_in_step_functions_reward_correct_steps_and_the_first_wrong_one():
    from dtppo.rewards import reward_function

    right, wrong = "3+4=7\n7*2=14\n#### 14", "3+4=7\n7*2=15\n15-1=14\n#### 14"
    steps = reward_function("arithmetic_steps")(prompts=["p", "p"], completions=[right, wrong])
    assert steps == [((5, 0.5), (12, 0.5)), ((5, 1 / 3), (20, 1 / 3))]
    first = reward_function("arithmetic_first_error")(prompts=["p", "p"], completions=[right, wrong])
    assert first == [(), ((12, -1.0),)]
    chat = [[{"role": "assistant", "content": wrong}]]
    assert call_function("arithmetic_first_error", reward_function("arithmetic_first_error"), ["p"], chat, {}) == [
        ((12, -1.0),)
    ]
