"""A run summarised and plotted: the results table shows only the validations that ran, each labelled by its step,
and the critic's explained variance counts only the steps where it is defined."""

import pytest

from dtppo import config as config_lib
from dtppo.observability.logger import MetricsLogger, explained_var_mean
from dtppo.observability.plot import curve


def results_rows(log_dir, records: list[tuple[int, dict]]) -> dict[str, str]:
    """The results table ``dtppo ppo`` prints after a run that logged ``records`` (step, metrics), as {label: value}."""
    from dtppo.observability.report import results_table

    logger = MetricsLogger(log_dir, total_steps=records[-1][0], tensorboard=False)
    for step, metrics in records:
        logger.log(step, metrics)
    logger.close()
    table = results_table(config_lib.from_dict({"logger": {"log_dir": str(log_dir)}}), {}, [])
    return {line.rsplit(None, 1)[0].strip(): line.rsplit(None, 1)[1] for line in table.splitlines()[2:]}


TRAIN = {"train/reward": 0.5}


def test_the_results_table_compares_the_end_with_a_validation_at_step_0(tmp_path):
    rows = results_rows(
        tmp_path, [(0, {"validation/accuracy": 0.25}), (1, TRAIN), (2, TRAIN | {"validation/accuracy": 0.5})]
    )
    assert rows == {
        "validation accuracy at start (step 0)": "0.2500",
        "validation accuracy at end (step 2)": "0.5000",
        "PPO gain (points)": "25.0000",
        "best validation accuracy": "0.5000",
    }


def test_without_a_validation_at_step_0_the_results_table_has_no_start_and_no_gain(tmp_path):
    # ppo.val_at_start=false: step 1's validation was printed as "at start (step 0)" and a gain computed from it
    records = [(1, TRAIN | {"validation/accuracy": 0.25}), (2, TRAIN), (3, TRAIN | {"validation/accuracy": 0.5})]
    assert results_rows(tmp_path / "val-period", records) == {
        "validation accuracy at end (step 3)": "0.5000",
        "best validation accuracy": "0.5000",
    }
    assert results_rows(tmp_path / "last-step-only", [(1, TRAIN), (2, TRAIN | {"validation/accuracy": 0.25})]) == {
        "validation accuracy at end (step 2)": "0.2500",
        "best validation accuracy": "0.2500",
    }


def test_explained_var_mean_leaves_out_steps_with_constant_returns():
    records = [
        {"step": 1, "train/critic/explained_var": -5.0, "train/critic/returns_var": 0.2},
        {"step": 2, "train/critic/explained_var": 0.4, "train/critic/returns_var": 0.2},
        # every sample got reward 0: the reference formula divides by 1e-8
        {"step": 3, "train/critic/explained_var": -868614.1, "train/critic/returns_var": 0.0},
        {"step": 4, "train/critic/explained_var": 0.2, "train/critic/returns_var": 0.25},
        {"step": 4, "validation/accuracy": 0.5},
    ]
    assert explained_var_mean(records, after_step=1) == (pytest.approx(0.3), 1)
    assert explained_var_mean(records, after_step=0) == (pytest.approx((-5.0 + 0.4 + 0.2) / 3), 1)
    assert explained_var_mean(records, after_step=4) == (None, 0)
    # a log written before returns_var existed: every step counts
    old = [{k: v for k, v in r.items() if k != "train/critic/returns_var"} for r in records]
    assert explained_var_mean(old, after_step=3) == (pytest.approx(0.2), 0)


def test_an_undefined_explained_var_is_left_out_of_plots():
    rows = [
        {
            "step": s,
            "train/reward": 0.0 if var == 0 else 0.5,
            "train/critic/explained_var": ev,
            "train/critic/returns_var": var,
        }
        for s, ev, var in [(1, 0.2, 0.2), (2, -868614.1, 0.0), (3, 0.3, 0.2)]
    ]
    assert curve(rows, "train/critic/explained_var") == [(1, 0.2), (3, 0.3)]
    assert curve(rows, "train/reward") == [(1, 0.5), (2, 0.0), (3, 0.5)]  # other metrics keep every step


def test_an_undefined_explained_var_prints_as_na(tmp_path, capsys):
    from dtppo.observability.report import results_table

    logger = MetricsLogger(tmp_path, total_steps=4, tensorboard=False)
    for step, ev, var in [(1, -2722022.0, 0.0), (2, 0.25, 0.2), (3, -868614.1, 0.0), (4, -5e5, 0.0)]:
        logger.log(step, {"train/reward": 0.5, "train/critic/explained_var": ev, "train/critic/returns_var": var})
    logger.close()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" EV ")[1].split()[0] for line in lines] == ["n/a", "0.250", "n/a", "n/a"]
    cfg = config_lib.from_dict({"logger": {"log_dir": str(tmp_path)}})
    table = results_table(cfg, {}, [])
    assert "-2722022" not in table and "-868614" not in table and "-500000" not in table
    rows = {line.rsplit(None, 1)[0].strip(): line.rsplit(None, 1)[1] for line in table.splitlines()[2:]}
    assert rows["critic explained variance, first step"] == "n/a"
    assert rows["critic explained variance, mean of last half"] == "n/a"  # steps 3 and 4
    assert rows["last-half steps with constant returns (EV undefined, left out)"] == "2"
