"""bench/learning/long_task.py's figures from a run's metrics, and the driver's ``--keep``: an earlier record's runs
joined by SFT seed (bench/learning/driver.py)."""

import json

from bench.learning import driver, long_task

STEPS = 20


def _step(step: int, ev: float, returns_var: float, reward: float) -> dict:
    return {
        "step": step,
        "train/critic/explained_var": ev,
        "train/critic/returns_var": returns_var,
        "train/reward": reward,
        "train/mean_gen_tokens_per_sample": 1000.0 + step,
        "train/truncation_rate": 0.5 if step == STEPS else 0.0,
        "timing/step": 20.0 + step,
    }


def test_figures_leave_out_the_ev_of_a_step_with_constant_returns():
    records = [{"step": 0, "validation/accuracy": 0.25}]
    records += [_step(s, ev=0.1 * (s % 3), returns_var=0.2, reward=0.1) for s in range(1, STEPS + 1)]
    records[-1]["train/critic/returns_var"] = 0.0  # every sample got the same reward: EV = 1 - Var / 1e-8
    records[-1]["train/critic/explained_var"] = -1.0e6
    records[10]["validation/accuracy"] = 0.5  # validation is logged in its step's record
    records[-1]["validation/accuracy"] = 0.125
    got = long_task.figures(records, {"steps": STEPS})
    assert (got["accuracy_start"], got["accuracy_best"], got["accuracy_final"]) == (0.25, 0.5, 0.125)
    assert got["gain_final"] == -0.125
    later = [0.1 * (s % 3) for s in range(11, STEPS)]  # steps 11-19: step 20's EV is undefined
    assert abs(got["explained_var_last_half"] - sum(later) / len(later)) < 1e-12
    assert (got["response_length_first"], got["response_length_last"]) == (1001.0, 1000.0 + STEPS)
    assert got["truncation_rate_last"] == 0.5


def test_keep_joins_the_other_seeds_of_an_earlier_record(tmp_path):
    record = {
        "sft_models": {"0": {"sft_accuracy": 0.1}, "1": {"sft_accuracy": 0.3}},
        "sft_models_below_floor": {"2": {"sft_accuracy": 0.0}},
        "runs": [{"sft_seed": 0, "result": {}}, {"sft_seed": 1, "result": {}}],
    }
    path = tmp_path / "long_task.json"
    path.write_text(json.dumps(record))

    def done(run_seeds, below):
        runs = [{"arm": "ppo", "seed": 0, "sft_seed": s, "result": {}} for s in run_seeds]
        return {"runs": runs, "sft_models": {s: {} for s in run_seeds}, "below": below}

    now = done([1], {2: {}})
    driver.keep(now, path, "ppo")
    assert [r["sft_seed"] for r in now["runs"]] == [0, 1] and now["runs"][0]["arm"] == "ppo"
    assert now["sft_models"] == {0: {"sft_accuracy": 0.1}, 1: {}} and now["below"] == {2: {}}
    now = done([3], {})
    driver.keep(now, path, "ppo")
    assert [r["sft_seed"] for r in now["runs"]] == [0, 1, 3] and sorted(now["sft_models"]) == [0, 1, 3]
    assert now["below"] == {2: {"sft_accuracy": 0.0}}
