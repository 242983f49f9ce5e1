"""Step rewards end to end through the CLI, on the task PPO learns fast (tests/support/choice_task.py) with its
reward given as a step at the answer's first character instead of an outcome: PPO with a critic and GRPO with
process supervision both learn it, a run whose rewards never reach the returns does not (the negative control), and
a function whose step ends past its answer stops the run with one line (exit 2). A process reward model that
scores whether a step ends in ``a`` (hand-set weights, tests/support/prm_fixture.py) is learnt from as well."""

import re
from pathlib import Path

import pytest

from tests.functional.test_learning_gate import REWARD_GAIN_GATE, STEPS, WARMUP, reward_gain
from tests.support.choice_task import choice_args
from tests.support.cli import read_jsonl, run_cli
from tests.support.prm_fixture import last_char_prm

REWARDS = Path(__file__).parents[1] / "support" / "choice_reward.py"
STEP_REWARD = f"reward.functions=[{REWARDS}:first_is_a_step]"


def _run(task, name: str, *extra: str) -> list[dict]:
    root, files = task
    settings = [
        STEP_REWARD,
        "reward.accuracy_from=null",
        "policy.generation.min_new_tokens=2",
        f"ppo.max_num_steps={STEPS}",
        "ppo.normalize_advantages=false",
        f"ppo.validation.period={STEPS}",
    ]
    run_cli(choice_args(files, name, *settings, *extra), root)
    return [r for r in read_jsonl(root / name / "metrics.jsonl") if "train/reward" in r]


def test_ppo_with_a_critic_learns_from_a_step_reward(choice_task):
    records = _run(choice_task, "gae_steps", f"value.warmup.steps={WARMUP}", "value.updates_per_step=2")
    assert reward_gain(records) > REWARD_GAIN_GATE, [r["train/reward"] for r in records]
    # the step is the only reward: the function's mean is the sample's total
    assert all(r["train/reward/first_is_a_step"] == r["train/reward"] for r in records)


def test_a_step_reward_that_never_reaches_the_returns_teaches_nothing(choice_task, monkeypatch):
    monkeypatch.setenv("DTPPO_TEST_LEARNING_FAULT", "drop_rewards")
    records = _run(choice_task, "gae_dropped", f"value.warmup.steps={WARMUP}", "value.updates_per_step=2")
    assert reward_gain(records) < REWARD_GAIN_GATE / 3, [r["train/reward"] for r in records]


def test_grpo_with_process_supervision_learns_from_a_step_reward(choice_task):
    grpo = ["ppo.advantage_estimator=grpo", "ppo.num_prompts_per_step=16", "ppo.num_generations_per_prompt=4"]
    records = _run(choice_task, "grpo_steps", *grpo)
    start = sum(r["train/reward"] for r in records[:3]) / 3
    end = sum(r["train/reward"] for r in records[-3:]) / 3
    assert end - start > REWARD_GAIN_GATE, [r["train/reward"] for r in records]


def test_ppo_with_a_critic_learns_from_a_process_reward_model(choice_task):
    root, files = choice_task
    prm = last_char_prm(root / "prm", files["model"], "a")
    records = _run(
        choice_task,
        "prm",
        "reward.functions=[]",
        f"reward.process_model.path={prm}",
        f"value.warmup.steps={WARMUP}",
        "value.updates_per_step=2",
    )
    # an answer is one step scored where it ends (its second token) unless it is blank ("\n\n", EOS at once): then
    # it has none, counts 0 in train/reward and is left out of the part's mean, which is never below it
    assert all(r["train/reward/process_model"] >= r["train/reward"] - 1e-6 for r in records)
    assert any(r["train/reward/process_model"] == pytest.approx(r["train/reward"], abs=1e-6) for r in records)
    assert reward_gain(records) > REWARD_GAIN_GATE, [r["train/reward"] for r in records]


def test_a_step_past_the_answer_stops_the_run_with_one_line(choice_task):
    root, files = choice_task
    bad = f"reward.functions=[{REWARDS}:step_past_the_end]"
    proc = run_cli(
        choice_args(files, "bad_steps", bad, "reward.accuracy_from=null", "ppo.max_num_steps=1"), root, check=False
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "step_past_the_end" in lines[0], lines
    found = re.search(
        r"returned a step end (\d+) outside \(0, (\d+)\], the completion's characters for sample 0 ", lines[0]
    )
    assert found and int(found[1]) == int(found[2]) + 1, lines[0]
