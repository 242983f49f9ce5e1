"""Asynchronous PPO end to end (docs/guides/async.md): generation on a rank of its own is the synchronous loop bit for
bit at ppo.max_lag=0; at a lag, each batch comes from the policy exactly max_lag steps older, a run killed inside a
checkpoint resumes to the uninterrupted run's numbers, and a generation rank that dies stops the run with one line.
The random-moment kills are in the reliability campaign (`make reliability`, its async trials)."""

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.support.cli import checkpoint_tensors, read_jsonl
from tests.support.killing import (
    PAUSE_ENV,
    KillPoint,
    RunSpec,
    comparable_metrics,
    kill_at,
    launch,
    rank_processes,
    settle,
)
from tests.support.recipes import FAST, TINY

SPLIT = ("cluster.workers_per_node=2", "cluster.generation_ranks=1")


def _ppo(sft_dir, name, *extra):
    return [
        "ppo",
        TINY,
        *FAST,
        f"sft.output_dir={sft_dir}",
        "ppo.max_num_steps=3",
        "ppo.validation.period=3",
        "checkpointing.enabled=false",
        f"logger.log_dir={name}/log",
        *extra,
    ]


@pytest.mark.slow  # two runs side by side in fresh interpreters; generation ranks: test_remote.py
def test_lag_zero_on_a_generation_rank_is_the_synchronous_loop_bit_for_bit(sft_dir, tmp_path):
    # One thread per process in both runs (the same kernels compute the same numbers); the two run side by side.
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    runs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "dtppo", *_ppo(sft_dir, name, *extra)],
            cwd=tmp_path,
            env=env,
            stdout=(tmp_path / f"{name}.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        for name, extra in [("colocated", ()), ("split", SPLIT)]
    }
    for name, proc in runs.items():
        assert proc.wait(timeout=600) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    assert "generation: 1 generation rank(s), torch backend" in (tmp_path / "split.log").read_text()
    colocated = comparable_metrics(tmp_path / "colocated/log/metrics.jsonl")
    split = comparable_metrics(tmp_path / "split/log/metrics.jsonl")
    assert [r["step"] for r in split] == [0, 1, 2, 3]
    assert split == colocated
    trained = split[1:]
    # sampled tokens that vary from step to step, and a policy that moves: the comparison means something
    assert len({r["train/mean_gen_tokens_per_sample"] for r in trained}) > 1
    assert max(abs(r["train/probs_ratio_clamped_max"] - 1.0) for r in trained) > 1e-4
    assert all(r["train/staleness/max"] == 0.0 for r in trained)
    timings = read_jsonl(tmp_path / "split/log/metrics.jsonl")[1:]
    assert all(0.0 < r["perf/generation_busy_fraction"] <= 1.0 and r["timing/train_wait"] >= 0 for r in timings)


@pytest.mark.slow  # the reliability campaign's async trials kill at random moments at lag 2 (10 / 10 resumed)
def test_a_run_killed_at_lag_two_resumes_to_the_uninterrupted_run(tmp_path):
    """As tests/functional/test_kill.py: the kill lands in the last checkpoint's write, just before the rename, so
    up to it the killed launch *is* the uninterrupted run; the resume redoes the last step from step_3, whose
    checkpoint holds batch 3, sampled by the policy of step 1 and not trained on yet."""
    spec = RunSpec(
        steps=4, ranks=2, extra=(*SPLIT, "ppo.max_lag=2", "loss.rollout_correction.importance_sampling=token")
    )
    ckpt, log = tmp_path / "run/ckpt", tmp_path / "run/log/metrics.jsonl"
    point = KillPoint("checkpoint", 0.1, save=4, pause_s=0.4, wait_for="manifest.json")
    kill = kill_at(launch(spec, tmp_path, "run", {PAUSE_ENV: str(point.pause_s)}), point, ckpt, 0.0, random.Random(0))
    assert kill.killed and kill.stage == "tmp_step_4: manifest written, before rename", kill
    assert kill.steps_on_disk == [2, 3] and kill.leftover_processes == 0
    reference = comparable_metrics(log)
    # batch i from the policy of step i − 2 (of step 0 for the first two), and that policy differs from π_old
    assert [r["train/staleness/max"] for r in reference[1:]] == [0.0, 1.0, 2.0, 2.0]
    assert abs(reference[1]["train/behaviour_ratio/max"] - 1.0) < 1e-4
    assert max(abs(r["train/behaviour_ratio/max"] - 1.0) for r in reference[2:]) > 1e-3
    state = torch.load(ckpt / "step_3/trainer.pt", weights_only=True)["rollouts"]
    assert state["max_lag"] == 2 and list(state["in_flight"]) == ["3"] and state["in_flight"]["3"]["version"] == 1
    shutil.copytree(ckpt / "tmp_step_4", tmp_path / "reference_step_4")

    resumed = launch(spec, tmp_path, "run")
    assert resumed.wait(timeout=600) == 0, (tmp_path / "run.1.log").read_text()[-3000:]
    assert "resumed from" in (tmp_path / "run.1.log").read_text()
    assert comparable_metrics(log) == reference
    a, b = checkpoint_tensors(ckpt / "step_4"), checkpoint_tensors(tmp_path / "reference_step_4")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # a run with a generation rank; generation ranks: test_remote.py
def test_a_generation_rank_that_dies_stops_the_run_with_one_line(tmp_path):
    spec = RunSpec(
        steps=200, ranks=2, extra=(*SPLIT, "ppo.max_lag=1", "loss.rollout_correction.importance_sampling=token")
    )
    proc = launch(spec, tmp_path, "run")
    metrics, deadline = tmp_path / "run/log/metrics.jsonl", time.monotonic() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3) and time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / "run.0.log").read_text()[-3000:]
        time.sleep(0.1)
    ranks = rank_processes(proc)
    assert len(ranks) == 2
    os.kill(ranks[-1], signal.SIGKILL)  # the generation rank: spawned last
    assert proc.wait(timeout=120) == 6
    log = (tmp_path / "run.0.log").read_text()
    errors = [line for line in log.splitlines() if line.startswith("dtppo: error")]
    assert errors and all(re.search(r"generation rank", line) for line in errors), log[-3000:]
    assert "Traceback" not in log
    assert settle(proc.pid, 20) == 0
