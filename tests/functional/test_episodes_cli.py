"""Multi-turn episodes end to end (docs/guides/episodes.md): the same episodes and numbers at dp=1 and dp=2, GRPO over
episodes, a run killed inside a checkpoint resumes to the uninterrupted run, a broken environment stops the run with
one line, and the calculator example (SFT on transcripts, then PPO) runs."""

import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.cli import checkpoint_tensors, run_cli
from tests.support.killing import (
    PAUSE_ENV,
    KillPoint,
    RunSpec,
    comparable_metrics,
    kill_at,
    launch,
)
from tests.support.recipes import REPO, SMALL_MODEL

ENV = str(REPO / "tests" / "support" / "episode_env.py")
# Turns end at common characters too, so the random model's turns stop and episodes have several.
EPISODES = (
    f"env.class={ENV}:Tick",
    "env.stop=[a,e,o,' ']",
    "env.max_turns=3",
    "env.max_total_tokens=40",
    "env.num_workers=1",
)


def _spec(steps=2, ranks=1, *extra):
    return RunSpec(steps=steps, ranks=ranks, extra=(*EPISODES, *extra))


def _run_side_by_side(runs: dict[str, RunSpec], cwd: Path) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "dtppo", *spec.args(name)],
            cwd=cwd,
            env=env,
            stdout=(cwd / f"{name}.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        for name, spec in runs.items()
    }
    for name, proc in procs.items():
        assert proc.wait(timeout=600) == 0, (cwd / f"{name}.log").read_text()[-3000:]


@pytest.mark.slow  # four episode runs in three layouts; episodes end to end: the calculator example below
def test_episodes_are_layout_invariant_and_grpo_trains_on_their_returns(tmp_path):
    grpo = ("ppo.advantage_estimator=grpo", "ppo.num_generations_per_prompt=2", "ppo.num_prompts_per_step=4")
    _run_side_by_side(
        {"dp1": _spec(), "dp2": _spec(2, 2), "grpo": _spec(2, 1, *grpo)},
        tmp_path,
    )
    dp1 = comparable_metrics(tmp_path / "dp1/log/metrics.jsonl")
    dp2 = comparable_metrics(tmp_path / "dp2/log/metrics.jsonl")
    # The same episodes token for token (exact); the numbers computed from them to reduction order (dp=2 sums
    # each rank's block, then across ranks), as every dp=1 vs dp=2 comparison.
    exact = ("train/episodes/", "train/reward", "train/mean_gen_tokens_per_sample", "train/truncation_rate")
    for one, two in zip(dp1, dp2, strict=True):
        assert one.keys() == two.keys()
        for key in one:
            if key.startswith(exact):
                assert one[key] == two[key], key
            else:
                assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), key
    trained = dp1[1:]
    # Several turns with observations between them, and rewards from the environment: the comparison means something.
    assert all(r["train/episodes/turns"] > 1.2 and r["train/episodes/observation_tokens"] > 2 for r in trained)
    assert all(r["train/reward/env"] >= 0.1 and r["train/episodes/ended_by/env_done"] > 0 for r in trained)
    assert all(r["train/reward"] >= r["train/reward/env"] for r in trained)
    grpo_metrics = comparable_metrics(tmp_path / "grpo/log/metrics.jsonl")[1:]
    assert all(r["train/episodes/tool_calls"] > 0 and "train/critic/loss" not in r for r in grpo_metrics)
    assert any(r["train/advantages/max"] > 0 for r in grpo_metrics)


@pytest.mark.slow  # a kill inside the checkpoint write: test_kill.py; episodes end within a step, and their layouts
# are compared above (test_episodes_are_layout_invariant_and_grpo_trains_on_their_returns)
def test_an_episode_run_killed_in_a_checkpoint_resumes_to_the_uninterrupted_run(tmp_path):
    spec = _spec(2)
    ckpt, log = tmp_path / "run/ckpt", tmp_path / "run/log/metrics.jsonl"
    point = KillPoint("checkpoint", 0.1, save=2, pause_s=0.4, wait_for="manifest.json")
    kill = kill_at(launch(spec, tmp_path, "run", {PAUSE_ENV: str(point.pause_s)}), point, ckpt, 0.0, random.Random(0))
    assert kill.killed and kill.stage == "tmp_step_2: manifest written, before rename", kill
    assert kill.leftover_processes == 0  # environment processes included
    reference = comparable_metrics(log)
    assert reference[-1]["train/episodes/turns"] > 1.2
    shutil.copytree(ckpt / "tmp_step_2", tmp_path / "reference_step_2")
    resumed = launch(spec, tmp_path, "run")
    assert resumed.wait(timeout=600) == 0, (tmp_path / "run.1.log").read_text()[-3000:]
    assert "resumed from" in (tmp_path / "run.1.log").read_text()
    assert comparable_metrics(log) == reference
    a, b = checkpoint_tensors(ckpt / "step_2"), checkpoint_tensors(tmp_path / "reference_step_2")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_broken_environment_stops_the_run_with_one_line(tmp_path):
    proc = run_cli(_spec(2, 1, f"env.class={ENV}:Broken").args("broken"), tmp_path, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dtppo: error")]
    assert len(errors) == 1 and re.search(r"Broken'?: step raised ValueError: cannot read .* \(sample \d+\)", errors[0])
    assert "Traceback" not in proc.stderr


def test_the_calculator_example_trains_sft_on_transcripts_then_ppo(tmp_path):
    data = tmp_path / "runs/calculator-task"
    subprocess.run(
        [sys.executable, str(REPO / "examples/make_calculator_task.py"), str(data), "--train", "256", "--test", "16"],
        check=True,
        capture_output=True,
    )
    for folder in ("examples", "recipes"):
        (tmp_path / folder).symlink_to(REPO / folder)
    recipe = "examples/calculator-task.yaml"
    common = [
        *SMALL_MODEL,
        "ppo.validation.max_samples=16",
        "ppo.validation.batch_size=16",
        "logger.tensorboard=false",
        "sft.min_accuracy=0",
    ]
    run_cli(
        ["sft", recipe, *common, "sft.num_steps=20", "sft.val_period=20", "sft.batch_size=16"],
        tmp_path,
    )
    run_cli(
        [
            "ppo",
            recipe,
            *common,
            "ppo.max_num_steps=2",
            "ppo.validation.period=2",
            "ppo.num_prompts_per_step=8",
            "value.warmup.steps=0",
            "policy.train_global_batch_size=8",
            "value.train_global_batch_size=8",
            "checkpointing.enabled=false",
        ],
        tmp_path,
    )
    records = comparable_metrics(tmp_path / "runs/calculator-task/ppo/metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2] and "validation/accuracy" in records[-1]
    assert all("train/episodes/turns" in r for r in records[1:])
