"""The learning experiments' statistics (bench/common/stats.py: the t table, the 95 % interval), one run's figures
from its metrics, the driver's plan of a table and its summary over units (bench/learning/driver.py), and the
critic tables' arms (bench/learning/critic.py)."""

import math
import statistics

import pytest
import torch

from bench.common import stats
from bench.learning import critic, driver, report
from dtppo import config as config_lib

ALIGNMENT = critic.SPECS["alignment"]


def _args(*argv: str):
    return driver.parser(critic.SPECS).parse_args(["alignment", *argv])


@pytest.mark.parametrize("df", range(1, 31))
def test_t_table_is_the_975_quantile(df):
    # P(0 < T < t) = 0.475 by a trapezoid integral of the t density (float64).
    t = stats.T_975[df - 1]
    grid = torch.linspace(0.0, t, 200_001, dtype=torch.float64)
    density = torch.distributions.StudentT(torch.tensor(float(df), dtype=torch.float64)).log_prob(grid).exp()
    assert torch.trapezoid(density, grid).item() == pytest.approx(0.475, abs=1e-4)


def test_mean_ci95_by_hand():
    values = [0.30, 0.34, 0.28, 0.36, 0.32]  # mean 0.32, sample sd sqrt(0.001) ~ 0.0316
    out = stats.mean_ci95(values)
    half = 2.776 * statistics.stdev(values) / math.sqrt(5)
    assert out["n"] == 5 and out["mean"] == pytest.approx(0.32)
    assert out["ci95_low"] == pytest.approx(0.32 - half) and out["ci95_high"] == pytest.approx(0.32 + half)
    assert stats.mean_ci95([0.5]) == {"n": 1, "mean": 0.5, "ci95_low": None, "ci95_high": None}


def test_summarise_reads_accuracy_ev_and_the_decision_token_after_warmup():
    records = [{"step": 0, "validation/accuracy": 0.1}]
    for step in range(1, 7):
        records.append(
            {
                "step": step,
                "train/critic/explained_var": step / 10,
                "train/advantages/first_token_abs_mean": float(step),
                "timing/step": 2.0,
            }
        )
    records[3]["validation/accuracy"], records[6]["validation/accuracy"] = 0.5, 0.4
    out = driver.run_figures(records, {"policy_start_step": 2})
    assert (out["accuracy_start"], out["accuracy_best"], out["accuracy_final"]) == (0.1, 0.5, 0.4)
    assert out["gain_best"] == pytest.approx(0.4) and out["gain_final"] == pytest.approx(0.3)
    assert out["explained_var_last_half_mean"] == pytest.approx((0.4 + 0.5 + 0.6) / 3)  # steps 4..6 of 6
    assert out["decision_token_advantage"] == pytest.approx((3 + 4 + 5 + 6) / 4)  # steps 3..6 train the policy
    assert out["train_seconds"] == 12.0
    without_critic = [{k: v for k, v in r.items() if not k.startswith("train/critic/")} for r in records]
    grpo = driver.run_figures(without_critic, {"policy_start_step": 0})
    assert grpo["explained_var_last_half_mean"] is None


def test_the_table_flags_overlapping_intervals():
    def run(arm, seed, acc):
        result = {m: 0.0 for m in critic.METRICS} | {"accuracy_best": acc, "explained_var_last_half_mean": None}
        return {"arm": arm, "sft_seed": 0, "seed": seed, "result": result}

    results = [run("a", s, acc) for s, acc in enumerate((0.30, 0.32, 0.31))]
    results += [run("b", s, acc) for s, acc in enumerate((0.50, 0.52, 0.51))]
    summary = driver.summarise(ALIGNMENT, results)
    assert summary["intervals_overlap"]["accuracy_best"] is False
    assert "explained_var_last_half_mean" not in summary["a"]


def test_accuracy_within_counts_steps_at_their_median_time():
    # Steps of 2 s, one slowed to 30 s by another job; validation at steps 0, 2 and 4 (its time not counted).
    records = [{"step": 0, "validation/accuracy": 0.1, "timing/validation": 50.0}]
    records += [{"step": s, "timing/step": 30.0 if s == 1 else 2.0} for s in range(1, 5)]
    records[2]["validation/accuracy"], records[4]["validation/accuracy"] = 0.3, 0.6
    assert critic.accuracy_within(records, 3.9) == 0.1  # step 2 ends at 2 x 2 s
    assert critic.accuracy_within(records, 4.0) == 0.3
    assert critic.accuracy_within(records, 7.9) == 0.3
    assert critic.accuracy_within(records, 8.0) == 0.6
    assert driver.run_figures(records, {"policy_start_step": 0})["step_seconds_median"] == 2.0


def test_warmup_arms_freeze_the_policy_and_change_one_critic_setting():
    base = config_lib.load(driver.REPO / critic.RECIPE, ["ppo.max_num_steps=12"])
    arms = critic.warmup_arms(base)
    assert arms["base"] == ["value.warmup.steps=12", "ppo.validation.period=12"]
    for name, extra in arms.items():
        cfg = config_lib.load(driver.REPO / critic.RECIPE, ["ppo.max_num_steps=12", *extra])
        assert cfg.value.warmup.steps == cfg.ppo.max_num_steps  # the policy never trains
        assert len(extra) - 2 == len(critic.WARMUP_ARMS[name])


def test_a_tag_keeps_a_second_recipes_runs_apart():
    untagged = driver.plan(ALIGNMENT, _args("--seeds", "3"))
    tagged = driver.plan(ALIGNMENT, _args("--seeds", "3", "--tag", "mixed"))
    assert [r["log_dir"] for r in tagged] == [
        f"runs/critic/alignment/mixed/{arm}_seed3" for arm in ("shift", "noshift")
    ]
    assert not {r["log_dir"] for r in tagged} & {r["log_dir"] for r in untagged}  # --reuse never mixes them


def test_several_sft_models_are_the_units_and_the_paired_difference_is_unit_by_unit():
    def run(arm, sft_seed, seed, acc):
        result = {m: 0.0 for m in critic.METRICS} | {"accuracy_best": acc}
        return {"arm": arm, "sft_seed": sft_seed, "seed": seed, "result": result}

    # SFT model 0: shift 0.6/0.8 (mean 0.7), noshift 0.3/0.5 (0.4); model 1: shift 0.5 (0.4/0.6), noshift 0.5/0.5;
    # model 2: shift 0.9/0.9, noshift 0.6/0.6
    cells = {0: ([0.6, 0.8], [0.3, 0.5]), 1: ([0.4, 0.6], [0.5, 0.5]), 2: ([0.9, 0.9], [0.6, 0.6])}
    results = [
        run(arm, model, seed, accs[seed])
        for model, pair in cells.items()
        for arm, accs in zip(("shift", "noshift"), pair)
        for seed in (0, 1)
    ]
    assert stats.unit_values(results, "shift", "accuracy_best") == pytest.approx({0: 0.7, 1: 0.5, 2: 0.9})
    summary = driver.summarise(ALIGNMENT, results)
    assert summary["shift"]["accuracy_best"]["n"] == 3  # SFT models, not the 6 runs
    assert summary["shift"]["accuracy_best"]["mean"] == pytest.approx(0.7)
    diffs = [0.3, 0.0, 0.3]
    assert summary["paired_difference"]["accuracy_best"] == pytest.approx(stats.mean_ci95(diffs))


def test_sft_seeds_give_each_model_its_own_directory_and_run_names(tmp_path):
    runs = driver.plan(ALIGNMENT, _args("--seeds", "0", "1", "--sft-seeds", "3", "4", "--out", str(tmp_path)))
    assert len(runs) == 8
    assert {(r["sft_seed"], r["sft_dir"]) for r in runs} == {
        (3, str(tmp_path / "sft" / "seed3")),
        (4, str(tmp_path / "sft" / "seed4")),
    }
    assert str(tmp_path / "noshift_sft4_seed1") in {r["log_dir"] for r in runs}
    assert all("sft.seed=" in r["command"] for r in runs)
    shift_only = driver.plan(ALIGNMENT, _args("--sft-seeds", "3", "4", "--out", str(tmp_path), "--arms", "shift"))
    assert {r["arm"] for r in shift_only} == {"shift"} and len(shift_only) == 10  # the table's 5 seeds, 2 models


def test_the_demo_says_when_a_run_is_outside_its_range(capsys):
    assert report.expected_check(0.5, 0.4, 0.6) == "inside" and report.expected_check(0.4, 0.4, 0.6) == "inside"
    assert report.expected_check(0.39, 0.4, 0.6) == "OUTSIDE"
    expected = {"source": "test", "arms": {"shift": {"accuracy_best": [0.6, 0.9]}}}
    runs = [{"arm": "shift", "result": {"accuracy_best": 0.5}}, {"arm": "noshift", "result": {"accuracy_best": 0.5}}]
    report.print_expected(runs, expected)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[1].split() == ["shift", "accuracy_best", "0.500", "expected", "[0.600,", "0.900]:", "OUTSIDE"]
    assert len(lines) == 2  # an arm without a range is not judged
