"""bench/learning/long_task.py: a run's figures from its metrics, and an earlier record's runs kept by seed."""

import json

from bench.learning import long_task


def _step(step: int, ev: float, returns_var: float, reward: float) -> dict:
    return {
        "step": step,
        "train/critic/explained_var": ev,
        "train/critic/returns_var": returns_var,
        "train/reward": reward,
        "train/mean_gen_tokens_per_sample": 1000.0 + step,
        "train/truncation_rate": 0.5 if step == long_task.STEPS else 0.0,
        "timing/step": 20.0 + step,
    }


def test_figures_leave_out_the_ev_of_a_step_with_constant_returns():
    records = [{"step": 0, "validation/accuracy": 0.25}]
    records += [_step(s, ev=0.1 * (s % 3), returns_var=0.2, reward=0.1) for s in range(1, long_task.STEPS + 1)]
    records[-1]["train/critic/returns_var"] = 0.0  # every sample got the same reward: EV = 1 - Var / 1e-8
    records[-1]["train/critic/explained_var"] = -1.0e6
    records[10]["validation/accuracy"] = 0.5  # validation is logged in its step's record
    records[-1]["validation/accuracy"] = 0.125
    got = long_task.figures(records)
    assert (got["accuracy_start"], got["accuracy_best"], got["accuracy_final"]) == (0.25, 0.5, 0.125)
    assert got["gain_final"] == -0.125
    later = [0.1 * (s % 3) for s in range(11, long_task.STEPS)]  # steps 11-19: step 20's EV is undefined
    assert abs(got["explained_var_last_half"] - sum(later) / len(later)) < 1e-12
    assert (got["response_length_first"], got["response_length_last"]) == (1001.0, 1000.0 + long_task.STEPS)
    assert got["truncation_rate_last"] == 0.5


def test_kept_runs_take_the_other_seeds_of_an_earlier_record(tmp_path):
    record = {
        "sft_models": {"0": {"sft_accuracy": 0.1}, "1": {"sft_accuracy": 0.3}},
        "sft_models_below_floor": {"2": {"sft_accuracy": 0.0}},
        "runs": [{"sft_seed": 0, "result": {}}, {"sft_seed": 1, "result": {}}],
    }
    path = tmp_path / "long_task.json"
    path.write_text(json.dumps(record))
    runs, models, below = long_task.kept_runs(path, seeds=[1, 2, 3])
    assert [r["sft_seed"] for r in runs] == [0]
    assert models == {0: {"sft_accuracy": 0.1}} and below == {}
    runs, models, below = long_task.kept_runs(path, seeds=[3])
    assert [r["sft_seed"] for r in runs] == [0, 1] and sorted(models) == [0, 1] and below == {2: {"sft_accuracy": 0.0}}
