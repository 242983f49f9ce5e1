"""W&B (offline) and MLflow (a local file store) receive exactly the records of metrics.jsonl, read back through
each library's own reader; a resumed run (2 steps, then on to 3) continues the same W&B and MLflow runs.

Nothing may reach a network: W&B runs offline and MLflow's telemetry is off; where the machine allows it
the CLI runs in a network namespace of its own (``unshare -rn``) with only loopback up, so whatever the
libraries try, nothing leaves the machine (and the runs must finish without it)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.cli import read_jsonl
from tests.support.recipes import FAST, TINY

pytest.importorskip("wandb")
pytest.importorskip("mlflow")

from dtppo.observability.trackers import mlflow_name  # noqa: E402

SMALL = [
    "ppo.num_prompts_per_step=8",
    "ppo.validation.max_samples=8",
    "ppo.validation.batch_size=8",
    "policy.generation.max_new_tokens=16",
]  # the numbers do not matter here, only that they arrive
TRACKER_KEYS = [
    "logger.wandb.enabled=true",
    "logger.wandb.mode=offline",
    "logger.wandb.project=dtppo-test",
    "logger.wandb.run_name=resume",
    "logger.mlflow.enabled=true",
    "logger.mlflow.experiment=dtppo-test",
]


def _isolated() -> list[str]:
    """``unshare -rn`` with loopback up, when this machine lets an unprivileged user make namespaces."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return []
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True)
    return ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "-"] if probe.returncode == 0 else []


def _run(tmp_path: Path, steps: int) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"),
        WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"),
        WANDB_DATA_DIR=str(tmp_path / "wandb-data"),
        MLFLOW_ALLOW_FILE_STORE="true",
        MLFLOW_DISABLE_TELEMETRY="true",
        DO_NOT_TRACK="true",
    )
    env.pop("WANDB_API_KEY", None)
    args = [
        "ppo",
        TINY,
        *FAST,
        *SMALL,
        "ppo.init_from_sft=false",
        f"ppo.max_num_steps={steps}",
        "ppo.validation.period=2",
        "logger.log_dir=log",
        "checkpointing.checkpoint_dir=ckpt",
        "checkpointing.save_period=2",
        *TRACKER_KEYS,
        f"logger.mlflow.tracking_uri={(tmp_path / 'mlruns').as_uri()}",
    ]
    proc = subprocess.run(
        [*_isolated(), sys.executable, "-m", "dtppo", *map(str, args)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    return proc


def _same(a, b) -> bool:
    """metrics.jsonl writes a non-finite value as text ("nan"); W&B's JSON as "NaN"."""
    a, b = float(a), float(b)
    return a == b or (math.isnan(a) and math.isnan(b))


def _wandb_history(run_file: Path) -> dict[int, dict]:
    """{step: metrics} of one offline run, read by wandb's own transaction-log reader."""
    wandb_cli = Path(sys.executable).with_name("wandb")
    out = subprocess.run(
        [str(wandb_cli), "leet", "inspect", "--json", str(run_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    history = {}
    for line in out.splitlines():
        record = json.loads(line)
        if record.get("type") == "history":
            item = record["history"]["item"]
            history[int(item["_step"])] = {k: v for k, v in item.items() if not k.startswith("_")}
    return history


@pytest.mark.slow  # two CLI runs with W&B and MLflow; the trackers: tests/unit/observability
def test_wandb_and_mlflow_hold_the_metrics_jsonl_records_and_resume_continues_the_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for the reader here, as for the runs
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    _run(tmp_path, 2)
    first_ids = json.loads((tmp_path / "log/trackers.json").read_text())
    proc = _run(tmp_path, 3)
    assert "resumed from" in proc.stdout and "ckpt/step_2" in proc.stdout
    ids = json.loads((tmp_path / "log/trackers.json").read_text())
    assert ids == first_ids and set(ids) == {"wandb", "mlflow"}
    for step in (2, 3):  # the ids travel in the checkpoint's replicated state
        assert torch.load(tmp_path / f"ckpt/step_{step}/trainer.pt", weights_only=False)["trackers"] == ids

    records = read_jsonl(tmp_path / "log/metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    expected = {r["step"]: {k: v for k, v in r.items() if k != "step"} for r in records}

    # W&B: one offline directory per launch, both under the same run id; together they hold every step once.
    run_files = sorted((tmp_path / "log/wandb").glob(f"offline-run-*-{ids['wandb']}/run-{ids['wandb']}.wandb"))
    assert len(run_files) == 2
    parts = [_wandb_history(f) for f in run_files]
    assert sorted(parts[0]) == [0, 1, 2] and sorted(parts[1]) == [3]
    logged = parts[0] | parts[1]
    for step, metrics in expected.items():
        assert logged[step].keys() == metrics.keys(), step
        assert all(_same(logged[step][k], v) for k, v in metrics.items()), step

    # MLflow: the same run before and after the resume, finished, with every metric's full history.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("dtppo-test")
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [ids["mlflow"]]
    assert client.get_run(ids["mlflow"]).info.status == "FINISHED"
    keys = {k for metrics in expected.values() for k in metrics}
    for key in keys:
        history = sorted((m.step, m.value) for m in client.get_metric_history(ids["mlflow"], mlflow_name(key)))
        want = [(step, metrics[key]) for step, metrics in sorted(expected.items()) if key in metrics]
        assert [s for s, _ in history] == [s for s, _ in want], key
        assert all(_same(a, b) for (_, a), (_, b) in zip(history, want)), key
