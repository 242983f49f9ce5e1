"""The metrics log (``dtppo.observability.logger``): one JSON record per step, non-finite values as text, a resume
that drops the steps after its checkpoint and a line torn by a kill, the progress line, and the critic's explained
variance averaged over the steps where it is defined."""

import json

import pytest

from dtppo.errors import InputError
from dtppo.observability.logger import MetricsLogger, explained_var_defined, explained_var_mean, read_metrics


def _log(log_dir, steps, **kwargs):
    logger = MetricsLogger(log_dir, total_steps=10, tensorboard=False, progress=False, **kwargs)
    for step in steps:
        logger.log(step, {"train/reward": step / 10, "train/critic/loss": float("nan") if step == 2 else 0.5})
    logger.close()


def test_each_step_is_one_record_and_a_non_finite_value_is_written_as_text(tmp_path):
    _log(tmp_path, [0, 1, 2])
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [0, 1, 2] and records[1] == {
        "step": 1,
        "train/reward": 0.1,
        "train/critic/loss": 0.5,
    }
    assert records[2]["train/critic/loss"] == "nan"  # strict JSON has no NaN
    json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[2])


def test_a_resume_keeps_the_steps_up_to_its_checkpoint_and_drops_a_torn_line(tmp_path):
    _log(tmp_path, [0, 1, 2, 3])
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "train/rew')  # killed mid-write
    _log(tmp_path, [3, 4], resume_step=2)
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3, 4]
    _log(tmp_path, [0], resume_step=0)  # a fresh start keeps nothing
    assert [r["step"] for r in read_metrics(tmp_path)] == [0]


def test_a_disabled_logger_writes_nothing(tmp_path):
    logger = MetricsLogger(tmp_path / "rank1", total_steps=3, enabled=False)
    logger.log(1, {"train/reward": 1.0})
    logger.close()
    assert not (tmp_path / "rank1").exists()


def test_the_progress_line_shows_the_step_of_the_total_and_the_console_metrics(tmp_path, capsys):
    logger = MetricsLogger(tmp_path, total_steps=4, tensorboard=False)
    logger.log(2, {"train/reward": 0.25, "not/shown": 1.0})
    logger.close()
    line = capsys.readouterr().out.strip()
    assert line.startswith("step    2/4 [##########..........]") and "0.250" in line and "not/shown" not in line


def test_reading_a_directory_without_a_log_is_one_line_or_nothing(tmp_path):
    with pytest.raises(InputError, match="no metrics.jsonl"):
        read_metrics(tmp_path)
    assert read_metrics(tmp_path, missing_ok=True) == []


def test_explained_var_is_defined_only_where_the_returns_varied():
    assert explained_var_defined({"train/critic/explained_var": 0.3, "train/critic/returns_var": 0.2})
    assert not explained_var_defined({"train/critic/explained_var": -8e5, "train/critic/returns_var": 0.0})
    assert explained_var_defined({"train/critic/explained_var": 0.3})  # a log from before returns_var
    assert not explained_var_defined({"train/reward": 1.0})


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
