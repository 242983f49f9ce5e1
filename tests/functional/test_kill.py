"""Kill -9 inside the last checkpoint write, at one and at two ranks: the run resumes from the latest complete
checkpoint (never from the unrenamed one) and ends with exactly the uninterrupted run's metrics and weights.
The 20-trial random campaign against separate reference runs is `make reliability`
(tests/reliability/kill_campaign.py).

Two launches per case, no separate reference run: the kill lands after step 2 was trained, logged and written
in full to ``tmp_step_2`` (manifest included), just before the rename. Up to that instant the killed launch
*is* the uninterrupted run, so its metrics.jsonl and ``tmp_step_2`` are the reference; they are copied before
the resume, which must redo step 2 from ``step_1`` and reproduce both exactly."""

import random
import shutil

import pytest
import torch

from tests.support.cli import checkpoint_tensors
from tests.support.killing import PAUSE_ENV, KillPoint, RunSpec, comparable_metrics, kill_at, launch


@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_kill_before_the_rename_resumes_from_the_previous_step_and_reproduces_the_run(tmp_path, ranks):
    spec, ckpt, log = RunSpec(steps=2, ranks=ranks), tmp_path / "run/ckpt", tmp_path / "run/log/metrics.jsonl"
    point = KillPoint("checkpoint", 0.1, save=2, pause_s=0.4, wait_for="manifest.json")
    kill = kill_at(launch(spec, tmp_path, "run", {PAUSE_ENV: str(point.pause_s)}), point, ckpt, 0.0, random.Random(0))
    assert kill.killed and kill.stage == "tmp_step_2: manifest written, before rename", kill
    assert kill.steps_on_disk == [1] and kill.tmp_dirs == ["tmp_step_2"] and kill.step_dirs_verified
    assert kill.leftover_processes == 0
    reference_metrics = comparable_metrics(log)
    assert [r["step"] for r in reference_metrics] == [0, 1, 2]
    shutil.copytree(ckpt / "tmp_step_2", tmp_path / "reference_step_2")

    resumed = launch(spec, tmp_path, "run")
    assert resumed.wait(timeout=900) == 0, (tmp_path / "run.1.log").read_text()[-3000:]
    output = (tmp_path / "run.1.log").read_text()
    resumed_lines = [line for line in output.splitlines() if line.startswith("resumed from")]
    assert len(resumed_lines) == 1 and resumed_lines[0].endswith("run/ckpt/step_1"), resumed_lines
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_1", "step_2"]  # the leftover is gone
    assert comparable_metrics(log) == reference_metrics
    a, b = checkpoint_tensors(ckpt / "step_2"), checkpoint_tensors(tmp_path / "reference_step_2")
    assert a.keys() == b.keys() and any(".optim." in k for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
    state, reference = (
        torch.load(p / "trainer.pt", weights_only=True) for p in (ckpt / "step_2", tmp_path / "reference_step_2")
    )
    assert state["rollouts"] == reference["rollouts"] and state["steps_done"] == reference["steps_done"] == 2
