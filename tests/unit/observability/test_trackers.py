"""The trackers' own code, in this process (a W&B and MLflow run through the CLI, with a resume, is the slow tier's
tests/functional/test_trackers.py): MLflow's names, nothing opened when nothing is enabled, and an MLflow run that
holds each logged record and is continued, not duplicated, by its id."""

import pytest

from dtppo.config import LoggerConfig, MlflowConfig
from dtppo.observability.trackers import MlflowTracker, mlflow_name, open_trackers


def test_mlflow_names_keep_a_total_and_its_parts_apart():
    assert mlflow_name("train/reward") == "train/reward"
    assert mlflow_name("train/reward/gsm8k") == "train/reward:gsm8k"
    assert mlflow_name("validation/reward/model") == "validation/reward:model"
    assert mlflow_name("train/critic/explained_var") == "train/critic/explained_var"


def test_nothing_enabled_opens_nothing_and_writes_nothing(tmp_path):
    assert open_trackers(LoggerConfig(log_dir=str(tmp_path / "log")), {}, {}) == []
    assert not (tmp_path / "log").exists()


def test_an_mlflow_run_holds_the_records_and_its_id_continues_it(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    cfg = MlflowConfig(enabled=True, tracking_uri=f"file:{tmp_path / 'mlruns'}", experiment="dtppo-test")
    first = MlflowTracker(cfg, {"ppo": {"seed": 0}}, None)
    first.log(1, {"train/reward": 0.25, "train/reward/gsm8k": 0.5})
    first.close(ok=True)
    again = MlflowTracker(cfg, {"ppo": {"seed": 0}}, first.run_id)  # a resume: the id from the checkpoint
    again.log(2, {"train/reward": 0.75, "train/reward/gsm8k": 1.0})
    again.close(ok=False)
    client = MlflowClient(tracking_uri=cfg.tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("dtppo-test").experiment_id])
    assert run.info.run_id == first.run_id and run.info.status == "FAILED"
    history = {m.step: m.value for m in client.get_metric_history(first.run_id, "train/reward")}
    assert history == {1: 0.25, 2: 0.75}
    assert [m.value for m in client.get_metric_history(first.run_id, "train/reward:gsm8k")] == [0.5, 1.0]
