"""The closing results table of a PPO run (``dtppo.observability.report``): only the validations that ran, each
labelled by its step, and the critic's explained variance over the steps where it is defined."""

from dtppo.observability.logger import MetricsLogger
from dtppo.observability.report import results_table, run_results, table


def results_rows(log_dir, records: list[tuple[int, dict]]) -> dict[str, str]:
    """The results table ``dtppo ppo`` prints after a run that logged ``records`` (step, metrics), as {label: value}."""
    logger = MetricsLogger(log_dir, total_steps=records[-1][0], tensorboard=False)
    for step, metrics in records:
        logger.log(step, metrics)
    logger.close()
    table = results_table(str(log_dir), {}, [])
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
    # ppo.validation.at_start=false: step 1's validation was printed as "at start (step 0)" and a gain computed from it
    records = [(1, TRAIN | {"validation/accuracy": 0.25}), (2, TRAIN), (3, TRAIN | {"validation/accuracy": 0.5})]
    assert results_rows(tmp_path / "val-period", records) == {
        "validation accuracy at end (step 3)": "0.5000",
        "best validation accuracy": "0.5000",
    }
    assert results_rows(tmp_path / "last-step-only", [(1, TRAIN), (2, TRAIN | {"validation/accuracy": 0.25})]) == {
        "validation accuracy at end (step 2)": "0.2500",
        "best validation accuracy": "0.2500",
    }


def test_an_undefined_explained_var_prints_as_na(tmp_path, capsys):
    logger = MetricsLogger(tmp_path, total_steps=4, tensorboard=False)
    for step, ev, var in [(1, -2722022.0, 0.0), (2, 0.25, 0.2), (3, -868614.1, 0.0), (4, -5e5, 0.0)]:
        logger.log(step, {"train/reward": 0.5, "train/critic/explained_var": ev, "train/critic/returns_var": var})
    logger.close()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" EV ")[1].split()[0] for line in lines] == ["n/a", "0.250", "n/a", "n/a"]
    table = results_table(str(tmp_path), {}, [])
    assert "-2722022" not in table and "-868614" not in table and "-500000" not in table
    rows = {line.rsplit(None, 1)[0].strip(): line.rsplit(None, 1)[1] for line in table.splitlines()[2:]}
    assert rows["critic explained variance, first step"] == "n/a"
    assert rows["critic explained variance, mean of last half"] == "n/a"  # steps 3 and 4
    assert rows["last-half steps with constant returns (EV undefined, left out)"] == "2"


def test_a_table_aligns_its_labels_and_prints_floats_to_four_decimals():
    assert table("t", {"a": 0.5, "longer label": 3, "c": "n/a"}).splitlines() == [
        "t",
        "-" * 26,
        "a                 0.5000",
        "longer label           3",
        "c                    n/a",
    ]


def test_a_task_without_a_verifier_shows_its_validation_reward_and_the_step_time(tmp_path):
    records = [(0, {"validation/reward": 0.1}), (1, TRAIN), (2, TRAIN | {"validation/reward": 0.4})]
    logger = MetricsLogger(tmp_path, total_steps=2, tensorboard=False, progress=False)
    for step, metrics in records:
        logger.log(step, metrics)
    logger.close()
    history = [{"timing/step": 2.0}, {"timing/step": 4.0}]
    lines = results_table(str(tmp_path), {"SFT accuracy": 0.75}, history, reward_is_the_figure=True).splitlines()
    rows = {line.rsplit(None, 1)[0].strip(): line.rsplit(None, 1)[1] for line in lines[2:]}
    assert rows == {
        "SFT accuracy": "0.7500",
        "validation reward at start (step 0)": "0.1000",
        "validation reward at end (step 2)": "0.4000",
        "mean PPO step time (s)": "3.0000",
    }
    assert "validation reward" not in results_table(str(tmp_path), {}, history)  # a verifier: accuracy is the figure


def test_the_results_object_holds_what_the_table_shows(tmp_path):
    critic = {"train/critic/returns_var": 0.2}
    records = [
        (0, {"validation/accuracy": 0.25, "validation/reward": 0.3}),
        (1, TRAIN | critic | {"train/critic/explained_var": 0.1}),
        (
            2,
            TRAIN | critic | {"train/critic/explained_var": 0.5, "validation/accuracy": 0.75, "validation/reward": 0.8},
        ),
    ]
    logger = MetricsLogger(tmp_path, total_steps=2, tensorboard=False, progress=False)
    for step, metrics in records:
        logger.log(step, metrics)
    logger.close()
    results = run_results(str(tmp_path), {"sft/accuracy": 0.2}, [{"timing/step": 1.0}, {"timing/step": 3.0}])
    assert (results.accuracy_start, results.accuracy_end, results.end_step, results.best_accuracy) == (
        0.25,
        0.75,
        2,
        0.75,
    )
    assert (results.reward_start, results.reward_end, results.gain_points) == (0.3, 0.8, 50.0)
    assert (results.explained_var_first, results.explained_var_last_half) == (0.1, 0.5)  # the last half: step 2
    assert results.mean_step_seconds == 2.0 and results.sft == {"sft/accuracy": 0.2}
    assert results.table() == results_table(
        str(tmp_path), {"sft/accuracy": 0.2}, [{"timing/step": 1.0}, {"timing/step": 3.0}]
    )
