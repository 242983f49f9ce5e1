"""A NaN loss injected at chosen optimizer steps (DTPPO_TEST_NONFINITE): skipped and counted in the metrics;
ppo.max_consecutive_nonfinite_steps in a row stop the run with exit 3 and one line; the checkpoints left
behind hold only finite numbers."""

import torch

from tests.support.cli import checkpoint_tensors, read_jsonl, run_cli
from tests.support.killing import RunSpec  # the tiny run spec the kill tests use


def test_nonfinite_steps_are_skipped_counted_and_a_streak_stops_the_run(tmp_path):
    # 8 samples per step, minibatches of 4: the policy takes optimizer steps 2k-2 and 2k-1 in PPO step k.
    # Step 2's first is NaN (an isolated skip); all of step 3 and the first of step 4 make a streak of 3.
    proc = run_cli(RunSpec(steps=5).args("run"), tmp_path, check=False, env={"DTPPO_TEST_NONFINITE": "policy:2,4,5,6"})
    assert proc.returncode == 3, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dtppo: error")]
    assert errors == [
        "dtppo: error: policy: 3 consecutive optimizer steps had a non-finite loss or gradient "
        "(limit ppo.max_consecutive_nonfinite_steps = 3); stopping, the last checkpoint is unaffected"
    ]
    assert "Traceback" not in proc.stderr

    records = {r["step"]: r for r in read_jsonl(tmp_path / "run/log/metrics.jsonl")}
    assert sorted(records) == [0, 1, 2, 3]  # step 4 never finished
    assert [records[s]["train/skipped_steps"] for s in (1, 2, 3)] == [0.0, 1.0, 3.0]
    assert [records[s]["train/critic/skipped_steps"] for s in (1, 2, 3)] == [0.0, 0.0, 0.0]
    assert records[2]["train/loss"] == "nan" and records[3]["train/grad_norm"] == "nan"  # visible, not hidden
    assert isinstance(records[1]["train/loss"], float) and isinstance(records[2]["train/critic/loss"], float)

    ckpt = tmp_path / "run/ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_2", "step_3"]
    tensors = checkpoint_tensors(ckpt / "step_3", tmp_path)
    floats = [t for name, t in tensors.items() if t.is_floating_point()]
    assert len(floats) > 20 and all(torch.isfinite(t).all() for t in floats)
    state = torch.load(ckpt / "step_3/trainer.pt", weights_only=True)
    assert state["policy"]["skipped_steps"] == 3 and state["policy"]["consecutive_nonfinite"] == 2
