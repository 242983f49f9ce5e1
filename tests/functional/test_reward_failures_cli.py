"""A run whose reward functions fail (docs/guides/reliability.md, "User code that fails badly"), through the CLI: one
that always crashes stops with exit 2, one line and a checkpoint, at one rank and at two ranks under Ray; a flaky one (a
chunk in ten raises) runs to the end at two ranks, each failure counted and its samples left out of training."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import read_jsonl, run_cli
from tests.support.recipes import REPO

FUNCTIONS = REPO / "tests" / "support" / "failing_functions.py"
SMALL = [
    "policy.generation.max_new_tokens=8",
    "ppo.num_prompts_per_step=8",
    "ppo.validation.period=2",
    "ppo.validation.max_samples=8",
    "ppo.validation.batch_size=8",
    "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=4",
    "value.train_global_batch_size=8",
    "value.train_micro_batch_size=4",
    "logger.tensorboard=false",
    "logger.progress=false",
    "logger.log_dir=log",
    "checkpointing.checkpoint_dir=ckpt",
    "checkpointing.save_period=10",
    "reward.num_workers=2",  # two chunks of four per batch
]


def _run(tmp_path: Path, function: str, steps: int, *extra: str) -> subprocess.CompletedProcess:
    rows = [{"prompt": f"Write {i} stars"} for i in range(40)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = [
        "ppo",
        REPO / "recipes" / "base.yaml",
        "data.task=custom",
        "data.train.path=rows.jsonl",
        "data.validation.path=rows.jsonl",
        f"reward.functions=[{FUNCTIONS}:{function}]",
        f"ppo.max_num_steps={steps}",
        *SMALL,
        *extra,
    ]
    env = {"FLAKY_COUNTER": str(tmp_path / "calls"), "RAY_USAGE_STATS_ENABLED": "0"}
    return run_cli(args, tmp_path, timeout=600, check=False, env=env)


def _stopped_by(proc: subprocess.CompletedProcess, what: str, tmp_path: Path, ranks: int = 1) -> None:
    """Exit 2, one error line per rank naming the function, the kind and the checkpoint of step 3 (the third step of
    failures is past half of a 5-step window), every step's chunks counted, no traceback."""
    errors = [line for line in proc.stderr.splitlines() if "dtppo: error" in line]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(errors) == ranks and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for line in errors:
        assert re.search(
            rf"failing_functions.py:exits' {re.escape(what)}.* on 6 chunk\(s\); 6 of the 6 chunks scored in the last 3",
            line,
        )
        assert f"stopped after step 3 (checkpoint {tmp_path / 'ckpt' / 'step_3'})" in line
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_3"]
    steps = [r for r in read_jsonl(tmp_path / "log" / "metrics.jsonl") if "train/reward" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for record in steps:  # nothing was scored, so nothing trained: no loss, a reward of NaN
        assert record["train/reward/crashed_chunks"] == 2 and record["train/reward/failed_samples"] == 8
        assert record["train/reward"] == "nan" and "train/loss" not in record


def test_a_function_that_always_crashes_stops_the_run(tmp_path):
    proc = _run(tmp_path, "exits", 20, "ppo.validation.at_start=false", "ppo.validation.period=50")
    _stopped_by(proc, "crashed (its process died: exit code 3)", tmp_path)
    # the first crash of each step is named, once: 3 steps, not 6 chunks
    assert proc.stderr.count("failing_functions.py:exits' crashed (its process died: exit code 3) on samples") == 3


# Slow (25 s): the stop is the local run's (above), and a crashed Ray scoring actor's kind is checked in
# tests/unit/usercode/test_pool_bounds.py.
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")
def test_a_function_that_always_crashes_stops_a_ray_run_at_two_ranks(tmp_path):
    import tempfile

    ray_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's socket paths must stay short
    proc = _run(
        tmp_path,
        "exits",
        20,
        "ppo.validation.at_start=false",
        "ppo.validation.period=50",
        "cluster.backend=ray",
        "cluster.workers_per_node=2",
        f"cluster.ray_temp_dir={ray_dir}",
    )
    _stopped_by(proc, "crashed (its process died: Ray: ActorDiedError", tmp_path, ranks=2)


@pytest.mark.slow  # at 2 ranks; one rank: the test above
def test_a_flaky_function_is_counted_and_the_run_goes_on_at_two_ranks(tmp_path):
    proc = _run(tmp_path, "flaky", 6, "cluster.workers_per_node=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    calls = (tmp_path / "calls").stat().st_size
    records = read_jsonl(tmp_path / "log" / "metrics.jsonl")
    raised = {
        (r["step"], prefix): r[f"{prefix}/reward/raised_chunks"]
        for r in records
        for prefix in ("train", "validation")
        if f"{prefix}/reward/raised_chunks" in r and r[f"{prefix}/reward/raised_chunks"] > 0
    }
    # 6 steps and 4 validations of 2 chunks each: 20 calls, every 10th raised
    assert calls == 20 and sum(raised.values()) == calls // 10 == 2, raised
    assert proc.stderr.count("flaky' raised ConnectionError: sandbox dropped request") == 2
    for (step, prefix), count in raised.items():
        record = next(r for r in records if r["step"] == step)
        assert record[f"{prefix}/reward/failed_samples"] == 4 * count
        if prefix == "train":  # the step trained on the other chunk's samples
            assert "train/loss" in record and record["train/reward"] != "nan"
    steps = [r for r in records if "train/reward" in r]
    assert len(steps) == 6 and all("train/loss" in r for r in steps)
