"""Metrics sinks: JSONL (flushed every step), TensorBoard, the optional W&B / MLflow trackers, and a
one-line-per-step console progress with ETA."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dtppo.algorithms.losses import EV_MIN_RETURNS_VAR
from dtppo.errors import InputError
from dtppo.files import write_file

if TYPE_CHECKING:
    from dtppo.observability.trackers import Tracker

CONSOLE_KEYS = [
    ("sft/loss", "loss"),
    ("sft/accuracy", "sft_acc"),
    ("sft/validation_accuracy", "val_acc"),
    ("train/reward", "reward"),
    ("validation/accuracy", "val_acc"),
    ("train/critic/explained_var", "EV"),
    ("train/critic/loss", "vf_loss"),
    ("train/mean_gen_tokens_per_sample", "len"),
]


class MetricsLogger:
    """Writes ``<log_dir>/metrics.jsonl`` (one object per step with "step") and TensorBoard events there, and
    hands every record to ``trackers`` (see ``dtppo.observability.trackers``) with the same names and step.

    On resume, pass ``resume_step``: lines of later steps (written after the last checkpoint, before a
    crash) are dropped so the file holds each step once.
    """

    def __init__(
        self,
        log_dir: str | Path,
        total_steps: int,
        tensorboard: bool = True,
        progress: bool = True,
        resume_step: int = 0,
        enabled: bool = True,
        trackers: Sequence[Tracker] = (),
    ):
        self.enabled = enabled
        if not enabled:  # non-zero ranks of a multi-rank run
            return
        self.trackers = list(trackers)
        self.dir = Path(log_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self._truncate_after(resume_step)
        self.file = self.path.open("a", encoding="utf-8")
        self.total_steps, self.progress = total_steps, progress
        self.start_step, self.start_time = resume_step, time.monotonic()
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(self.dir))

    def _truncate_after(self, step: int) -> None:
        """Keep the records of steps 1..``step`` and the step-0 validation when resuming (step > 0); a
        fresh start (step 0) re-logs step 0, so it keeps nothing. A line torn by a kill is dropped. The
        file is replaced atomically: a kill here must not lose the records of earlier steps."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record_step = json.loads(line)["step"]
            except (ValueError, KeyError, TypeError):
                continue
            if step > 0 and record_step <= step:
                kept.append(line)
        write_file(self.path, "".join(line + "\n" for line in kept))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        record = {"step": step, **{k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()}}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.writer is not None:
            for name, value in metrics.items():
                self.writer.add_scalar(name, value, step)
            self.writer.flush()
        for tracker in self.trackers:
            tracker.log(step, metrics)
        if self.progress:
            print(self._progress_line(step, metrics), file=sys.stdout, flush=True)

    def _progress_line(self, step: int, metrics: dict[str, float]) -> str:
        done = max(step - self.start_step, 1)
        per_step = (time.monotonic() - self.start_time) / done
        eta = per_step * max(self.total_steps - step, 0)
        frac = step / max(self.total_steps, 1)
        bar = "#" * int(20 * frac) + "." * (20 - int(20 * frac))
        shown = " ".join(f"{short} {_shown(key, metrics)}" for key, short in CONSOLE_KEYS if key in metrics)
        return f"step {step:>4}/{self.total_steps} [{bar}] {shown} | {per_step:.2f}s/step ETA {_duration(eta)}"

    def close(self, ok: bool = True) -> None:
        """``ok``: the run ended normally (trackers mark their run finished, else failed)."""
        if not self.enabled:
            return
        self.file.close()
        if self.writer is not None:
            self.writer.close()
        for tracker in self.trackers:
            tracker.close(ok)


def _shown(key: str, metrics: dict[str, float]) -> str:
    """A console value to 3 decimals; "n/a" for an undefined explained variance (constant returns)."""
    if key == "train/critic/explained_var" and not explained_var_defined(metrics):
        return "n/a"
    return f"{metrics[key]:.3f}"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def explained_var_defined(record: dict) -> bool:
    """Whether a step's ``train/critic/explained_var`` means anything.

    A step in which every sample got the same reward has constant returns: its logged EV is
    1 − Var(R − V) / 1e-8 (the reference's formula), a number as low as −10⁶ that says nothing about the critic.
    Such a step has ``train/critic/returns_var`` ≤ 1e-8; a log written before that metric existed counts as defined.
    """
    return (
        "train/critic/explained_var" in record and record.get("train/critic/returns_var", math.inf) > EV_MIN_RETURNS_VAR
    )


def explained_var_mean(records: list[dict], after_step: float) -> tuple[float | None, int]:
    """Mean of ``train/critic/explained_var`` over the steps after ``after_step`` where it is defined
    (:func:`explained_var_defined`). Returns (the mean, or None when no step counts; the number left out)."""
    steps = [r for r in records if "train/critic/explained_var" in r and r["step"] > after_step]
    defined = [r["train/critic/explained_var"] for r in steps if explained_var_defined(r)]
    return (sum(defined) / len(defined) if defined else None), len(steps) - len(defined)


def read_metrics(log_dir: str | Path, missing_ok: bool = False) -> list[dict]:
    """All records of ``<log_dir>/metrics.jsonl``; ``missing_ok``: none (not an error) when a run has not started."""
    path = Path(log_dir) / "metrics.jsonl"
    if not path.is_file():
        if missing_ok:
            return []
        raise InputError(f"{log_dir}: no metrics.jsonl (not a dtppo log directory)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
