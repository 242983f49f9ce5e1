"""Two GRPO steps from the CLI (``ppo.advantage_estimator=grpo``) on the task PPO learns fast
(tests/support/choice_task.py): the policy gates of the PPO smoke test hold, no critic exists anywhere (metrics,
checkpoint, export), and a resume from step 1 reproduces step 2."""

import shutil

import torch

from tests.support.choice_task import choice_args
from tests.support.cli import checkpoint_tensors, read_jsonl, run_cli
from tests.support.gates import assert_reference_gates, gate_failures

# 16 prompts x 4 samples per step. About 1 answer in 9 is rewarded at the start: a group of 4 is mixed with
# probability ~0.3, and a step of 16 groups holds no mixed one with probability ~0.003, so the policy update and
# the resume below see a real gradient (the tiny recipe's briefly fine-tuned model scored 0 in every group).
GRPO = ["ppo.advantage_estimator=grpo", "ppo.num_prompts_per_step=16", "ppo.num_generations_per_prompt=4"]


def _args(files):
    return [
        *choice_args(files, "log", *GRPO),
        "ppo.max_num_steps=2",
        "ppo.ppo_epochs=2",
        "ppo.validation.period=2",
        "reward.accuracy_from=first_is_a",
        "checkpointing.enabled=true",
        "checkpointing.checkpoint_dir=ckpt",
        "checkpointing.save_period=1",
        "checkpointing.keep_last=5",
    ]


def test_grpo_trains_the_policy_without_a_critic(choice_task, tmp_path):
    files = choice_task[1]
    run_cli(_args(files), tmp_path)
    records = read_jsonl(tmp_path / "log" / "metrics.jsonl")
    steps = [r for r in records if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2]
    assert_reference_gates(steps, critic=False)
    assert gate_failures(steps, critic=False) == []
    assert all(r["train/advantages/max"] > 0.0 for r in steps)  # every step held a mixed group: the policy trained
    for r in steps:
        # Group-normalised, binary rewards, G = 4: |A| <= (G-1)/sqrt(G) = 1.5; a step whose rewards are all 0 has
        # no advantage and no policy gradient; a mixed group has both signs.
        assert -1.5 - 1e-3 <= r["train/advantages/min"] <= r["train/advantages/max"] <= 1.5 + 1e-3
        if r["train/reward"] == 0.0:
            assert r["train/advantages/max"] == r["train/advantages/min"] == 0.0 and r["train/grad_norm"] == 0.0
        if r["train/advantages/max"] > 0.0:
            assert r["train/advantages/min"] < 0.0 and r["train/grad_norm"] > 0.0
    assert "validation/accuracy" in steps[-1]
    # No critic: no critic metrics, no critic timing phases, no critic state in the checkpoint.
    assert not [k for r in records for k in r if k.startswith("train/critic/")]
    assert not [k for r in records for k in r if k in ("timing/value_inference", "timing/critic_update")]
    for step in (1, 2):
        saved = checkpoint_tensors(tmp_path / "ckpt" / f"step_{step}", tmp_path)
        assert any(k.startswith("policy.model.") for k in saved)
        assert not [k for k in saved if not k.startswith("policy.")], "critic state in a GRPO checkpoint"
        trainer = torch.load(tmp_path / "ckpt" / f"step_{step}" / "trainer.pt", weights_only=False)
        assert "value" not in trainer and trainer["steps_done"] == step
    exported = run_cli(["export", tmp_path / "ckpt", tmp_path / "hf"], tmp_path)
    assert (tmp_path / "hf" / "policy").is_dir() and not (tmp_path / "hf" / "critic").exists(), exported.stdout

    # Resume: keep only step_1, run to step 2 again; the metrics and weights of step 2 must be the same.
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(tmp_path / "ckpt" / "step_1", resumed / "ckpt" / "step_1")
    shutil.copytree(tmp_path / "log", resumed / "log")
    proc = run_cli(_args(files), resumed)
    assert "resumed from" in proc.stdout and "ckpt/step_1" in proc.stdout

    def comparable(r):
        return {k: v for k, v in r.items() if not k.startswith(("timing/", "perf/"))}

    again = read_jsonl(resumed / "log" / "metrics.jsonl")
    assert [comparable(r) for r in again] == [comparable(r) for r in records]
    a = checkpoint_tensors(tmp_path / "ckpt" / "step_2", tmp_path)
    b = checkpoint_tensors(resumed / "ckpt" / "step_2", resumed)
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]), name
