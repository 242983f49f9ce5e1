"""A learned reward model through the CLI: PPO raises the score of a tiny RM trained inside the test, a control whose
RM weight is 0 (scored and logged, not rewarded) does not, and a critic can start from the RM's directory.

Protocol (fixed before the figures were looked at): the RM is trained to score the share of "7"s in a completion
(tests/support/reward_model_fixture.py); 12 PPO steps from the random tiny policy, ppo.seed 0, 32 prompts per step; the
gain is the mean of train/reward/model over steps 10-12 minus its mean over steps 1-3. Measured (both CPU kernel
sets gave the same curve, and ppo.seed 1 and 2 the same picture): treatment -0.039 -> +0.284, control -0.044 ->
-0.051 (docs/guides/rewards.md).
"""

from __future__ import annotations

import json

import pytest

from tests.support.cli import read_jsonl, run_cli
from tests.support.recipes import REPO
from tests.support.reward_model_fixture import train_tiny_reward_model

STEPS = 12
ARGS = [
    "data.task=custom",
    "data.train.path=prompts.jsonl",
    "data.validation.path=prompts.jsonl",
    "reward.functions=[]",
    "checkpointing.enabled=false",
    "logger.tensorboard=false",
    "logger.progress=false",
    "ppo.num_prompts_per_step=32",
    "ppo.validation.at_start=false",
    "ppo.validation.max_samples=8",
    "ppo.validation.batch_size=8",
    "policy.generation.max_new_tokens=16",
    "policy.optimizer.lr=1.0e-3",
    "policy.train_global_batch_size=16",
    "policy.train_micro_batch_size=16",
    "value.train_global_batch_size=16",
    "value.train_micro_batch_size=16",
    "reward.num_workers=0",
]


def _run(tmp_path, name: str, *extra: str) -> list[dict]:
    run_cli(["ppo", REPO / "recipes" / "base.yaml", *ARGS, f"logger.log_dir={name}", *extra], cwd=tmp_path)
    return read_jsonl(tmp_path / name / "metrics.jsonl")


def _gain(records: list[dict]) -> float:
    scores = [r["train/reward/model"] for r in records if "train/reward/model" in r]
    assert len(scores) == STEPS
    return sum(scores[-3:]) / 3 - sum(scores[:3]) / 3


@pytest.mark.slow
def test_ppo_raises_a_learned_reward_models_score_and_a_zero_weight_control_does_not(tmp_path):
    rm = train_tiny_reward_model(tmp_path / "rm")
    (tmp_path / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": f"Write some sevens, {i}"}) + "\n" for i in range(64))
    )
    steps = [f"ppo.max_num_steps={STEPS}", f"ppo.validation.period={STEPS}"]
    treated = _run(tmp_path, "rm", f"reward.model.path={rm}", *steps)
    control = _run(tmp_path, "control", f"reward.model.path={rm}", "reward.model.weight=0", *steps)
    first = next(r for r in treated if "train/reward" in r)
    assert first["train/reward"] == pytest.approx(first["train/reward/model"], rel=1e-6)  # the RM alone, weight 1
    assert all(r["train/reward"] == 0.0 for r in control if "train/reward" in r)  # weight 0: logged, not rewarded
    assert "validation/reward/model" in treated[-1] and "validation/accuracy" not in treated[-1]
    treated_gain, control_gain = _gain(treated), _gain(control)
    assert treated_gain > 0.15, treated_gain
    assert control_gain < 0.05, control_gain
    # TRL's convention: the critic starts from the RM's backbone and score head (numbers:
    # tests/unit/rewards/test_model.py)
    critic = _run(
        tmp_path,
        "critic",
        f"reward.model.path={rm}",
        f"value.model.path={rm}",
        "ppo.max_num_steps=1",
        "ppo.validation.period=1",
    )
    assert [r["step"] for r in critic if "train/critic/explained_var" in r] == [1]
