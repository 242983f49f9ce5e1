"""Optional experiment trackers: Weights & Biases and MLflow receive every metrics.jsonl record, same names and
steps, from rank 0 (``MetricsLogger`` calls them).

A tracker's run id is kept in the checkpoint's replicated state (``trainer.save``), so a resumed run logs its
next steps into the same W&B / MLflow run; ``<log_dir>/trackers.json`` names the ids too, for people and
scripts looking for the run. Each package is imported only when its section is enabled (the config refused
the recipe at load if it is not installed).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Protocol

from dtppo.config import LoggerConfig, MlflowConfig, WandbConfig
from dtppo.errors import InputError
from dtppo.files import write_file


class Tracker(Protocol):
    name: str
    run_id: str

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self, ok: bool) -> None: ...


class WandbTracker:
    """One W&B run; its files go to ``<log_dir>/wandb`` (the whole run there in offline mode)."""

    name = "wandb"

    def __init__(self, cfg: WandbConfig, log_dir: Path, config: dict[str, Any], run_id: str | None):
        import wandb

        # No console capture or system sampling: our progress line is the console; metrics are the record.
        settings = wandb.Settings(
            console="off", x_disable_stats=True, x_disable_meta=True, disable_git=True, save_code=False, silent=True
        )
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            name=cfg.run_name,
            mode=cfg.mode,
            dir=str(log_dir),
            config=config,
            id=run_id,
            resume="allow" if run_id else None,
            settings=settings,
        )
        self.run_id = self.run.id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def close(self, ok: bool) -> None:
        self.run.finish(exit_code=0 if ok else 1)


class MlflowTracker:
    """One MLflow run in ``experiment``, through the client API (no process-global active run)."""

    name = "mlflow"

    def __init__(self, cfg: MlflowConfig, config: dict[str, Any], run_id: str | None):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=cfg.tracking_uri)
        if run_id is None:
            experiment = self.client.get_experiment_by_name(cfg.experiment)
            experiment_id = (
                experiment.experiment_id if experiment is not None else self.client.create_experiment(cfg.experiment)
            )
            self.run_id = self.client.create_run(experiment_id, run_name=cfg.run_name).info.run_id
            self.client.log_dict(self.run_id, config, "config.json")
        else:
            self.run_id = run_id
            self.client.update_run(run_id, status="RUNNING")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(mlflow_name(k), v, now, step) for k, v in metrics.items()])

    def close(self, ok: bool) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")


def mlflow_name(name: str) -> str:
    """MLflow's name for a metric: the same, except a reward part (``train/reward/<part>``) is
    ``train/reward:<part>``. MLflow's file store keeps each metric in a file at its name's path, so the total
    ``train/reward`` (a file) and its parts (files under a directory of that name) cannot both be stored."""
    for total in ("train/reward/", "validation/reward/"):
        if name.startswith(total):
            return f"{total[:-1]}:{name[len(total) :]}"
    return name


class TrackerRuns:
    """The W&B / MLflow run ids of a PPO run (rank 0), kept in its checkpoints so that a resumed run continues them."""

    def __init__(self) -> None:
        self.ids: dict[str, str] = {}

    def open(self, cfg: LoggerConfig, config: dict[str, Any]) -> list[Tracker]:
        """The enabled trackers (``open_trackers``), continuing the runs of ``ids``; their ids kept."""
        trackers = open_trackers(cfg, config, self.ids)
        self.ids = {t.name: t.run_id for t in trackers}
        return trackers

    def state_dict(self) -> dict[str, str]:
        return dict(self.ids)

    def load_state_dict(self, state: dict[str, str] | None) -> None:
        self.ids = dict(state or {})  # None: a checkpoint written before trackers existed


def open_trackers(cfg: LoggerConfig, config: dict[str, Any], run_ids: dict[str, str]) -> list[Tracker]:
    """The enabled trackers, continuing the runs in ``run_ids`` ({"wandb": id, "mlflow": id}, from the
    checkpoint) or starting new ones; their ids are written to ``<log_dir>/trackers.json``."""
    names = [name for name, section in [("wandb", cfg.wandb), ("mlflow", cfg.mlflow)] if section.enabled]
    if not names:
        return []
    Path(cfg.log_dir).mkdir(parents=True, exist_ok=True)
    trackers = [_start(name, cfg, config, run_ids.get(name)) for name in names]
    ids = {t.name: t.run_id for t in trackers}
    write_file(Path(cfg.log_dir) / "trackers.json", json.dumps(ids, indent=1) + "\n")
    return trackers


def _start(name: str, cfg: LoggerConfig, config: dict[str, Any], run_id: str | None) -> Tracker:
    try:
        if name == "wandb":
            return WandbTracker(cfg.wandb, Path(cfg.log_dir), config, run_id)
        return MlflowTracker(cfg.mlflow, config, run_id)
    # Either library fails in many ways (no login, unreachable server, unknown run id): each is one line.
    except Exception as err:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
        resuming = f" (resuming run {run_id})" if run_id else ""
        raise InputError(f"logger.{name}: cannot start the run{resuming}: {type(err).__name__}: {detail}") from err
