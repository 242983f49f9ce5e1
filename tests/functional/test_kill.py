"""Kill -9 inside a checkpoint write, at one and at two ranks: the run resumes from the latest complete
checkpoint (never the half-written one) and ends with exactly the uninterrupted run's metrics and weights.
The 20-trial random campaign is `make reliability` (tests/reliability/kill_campaign.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))
from killing import KillPoint, RunSpec, reference_run, run_trial  # noqa: E402


@pytest.mark.parametrize("ranks", [1, 2])
def test_kill_inside_a_checkpoint_write_then_resume(tmp_path, ranks):
    spec = RunSpec(steps=2, ranks=ranks)
    reference_s = reference_run(spec, tmp_path)
    # Half-way through the three test pauses of step_2's write: step_1 is whole, tmp_step_2 is not.
    result = run_trial(spec, tmp_path, "killed", [KillPoint("checkpoint", 0.5, save=2)], "reference", reference_s,
                       rng_seed=ranks)
    kill = result.kills[0]
    assert kill.killed and kill.stage.startswith("tmp_step_2: "), kill
    assert kill.steps_on_disk == [1] and "tmp_step_2" in kill.tmp_dirs and kill.step_dirs_verified
    assert kill.resumed_from == 1 and kill.leftover_processes == 0
    assert result.final_rc == 0 and result.problems == []
    assert result.metrics_equal and result.max_metric_abs_diff == 0.0
    assert result.weights_equal and result.max_weight_abs_diff == 0.0 and result.trainer_state_equal
