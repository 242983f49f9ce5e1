"""Kill -9 trials: start a tiny PPO run, SIGKILL it at chosen moments, resume it to the end, and compare the
result with an uninterrupted reference run, exactly (every metric with ==, every tensor with torch.equal).

Used by tests/functional/test_kill.py (two trials in `make test`) and tests/reliability/kill_campaign.py
(20 seeded trials, `make reliability`). What a trial checks after each kill:
- every ``step_N`` directory left on disk passes its manifest check (a kill never leaves a partial one);
- no process of the killed run is left (its whole process group is gone);
- the next launch resumes from the latest ``step_N`` present at the kill (never from a ``tmp_step_N``);
and at the end: exit code 0, metrics.jsonl equal to the reference's, final weights, optimizer state, loader
position and counters equal to the reference's.

Kill points:
- ``checkpoint``: the run gets ``DTPPO_TEST_PAUSE_IN_CHECKPOINT`` (a pause after each of the 4 stages of a
  write); the kill lands a random fraction of those 4 pauses after ``tmp_step_<save>`` appears;
- ``time``: a random moment, a fraction of the reference run's wall time after the launch (scaled by the
  share of steps left when the launch resumes; a first launch that ends before its moment is restarted
  from scratch with the moment timed against it, as the shared machine's speed varies);
- ``one_rank`` (two ranks only): at a random moment only one rank is killed; the launcher must notice,
  stop the other rank and exit by itself (a hang is a failure).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from tests.support.cli import checkpoint_tensors
from tests.support.recipes import SMALL_MODEL, TINY

PAUSE_ENV = "DTPPO_TEST_PAUSE_IN_CHECKPOINT"
PAUSES_PER_WRITE = 4  # dtppo.checkpoint.store pauses after: mkdir, weights, trainer state, manifest


@dataclass(frozen=True)
class RunSpec:
    """A tiny PPO run (random-init small model, no SFT) that checkpoints every step and prunes old ones."""

    steps: int = 3
    ranks: int = 1
    extra: tuple[str, ...] = ()

    def args(self, name: str) -> list[str]:
        return [
            "ppo",
            TINY,
            "ppo.init_from_sft=false",
            *SMALL_MODEL,
            f"ppo.max_num_steps={self.steps}",
            "ppo.num_prompts_per_step=8",
            "ppo.validation.max_samples=8",
            "ppo.validation.batch_size=8",
            "ppo.validation.period=2",
            "policy.generation.max_new_tokens=16",
            "policy.train_global_batch_size=4",
            "policy.train_micro_batch_size=2",
            "value.train_global_batch_size=4",
            "value.train_micro_batch_size=2",
            f"cluster.workers_per_node={self.ranks}",
            "logger.tensorboard=false",
            "logger.progress=false",
            f"logger.log_dir={name}/log",
            f"checkpointing.checkpoint_dir={name}/ckpt",
            "checkpointing.save_period=1",
            "checkpointing.keep_last=2",
            *self.extra,
        ]


@dataclass(frozen=True)
class KillPoint:
    kind: str  # "checkpoint" | "time" | "one_rank"
    fraction: float  # of the 4 pauses (checkpoint) or of the expected wall time (time, one_rank)
    save: int = 1  # checkpoint: which step's write to hit
    pause_s: float = 0.4
    wait_for: str = ""  # checkpoint: start the clock when this file appears in tmp_step_<save> (else the dir)


@dataclass
class KillRecord:
    kind: str
    planned: str
    killed: bool = False
    seconds_after_launch: float = 0.0
    stage: str = ""  # where the checkpoint protocol was when the kill landed
    steps_on_disk: list[int] = field(default_factory=list)
    tmp_dirs: list[str] = field(default_factory=list)
    step_dirs_verified: bool = True
    leftover_processes: int = 0
    launcher_exited_by_itself: bool | None = None
    resumed_from: int | None = None  # filled in from the next launch's output; 0 = started fresh


@dataclass
class TrialResult:
    name: str
    ranks: int
    kills: list[KillRecord]
    final_rc: int = -1
    metrics_equal: bool = False
    max_metric_abs_diff: float = float("nan")
    weights_equal: bool = False
    max_weight_abs_diff: float = float("nan")
    trainer_state_equal: bool = False
    seconds: float = 0.0
    restarts: int = 0  # first launches that finished before a random-moment kill came (then redrawn in time)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return asdict(self) | {"ok": self.ok}


# ---------------------------------------------------------------------------------------------- processes


def launch(spec: RunSpec, cwd: Path, name: str, env_extra: dict[str, str] | None = None) -> subprocess.Popen:
    """The CLI in its own process group (so kill -9 reaches every rank it spawns); output to name.<n>.log."""
    env = {k: v for k, v in os.environ.items() if k != PAUSE_ENV}  # pause only where a trial asks for it
    env.update(PYTHONUNBUFFERED="1", **(env_extra or {}))
    logs = sorted(cwd.glob(f"{name}.*.log"))
    log = (cwd / f"{name}.{len(logs)}.log").open("w")
    return subprocess.Popen(
        [sys.executable, "-m", "dtppo", *spec.args(name)],
        cwd=cwd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def group_members(pgid: int) -> list[tuple[int, int, str]]:
    """(pid, ppid, cmdline) of the live (non-zombie) processes of process group ``pgid``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            fields = text[text.rindex(")") + 2 :].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
        state, ppid, pgrp = fields[0], int(fields[1]), int(fields[2])
        if pgrp == pgid and state != "Z":
            members.append((int(stat.parent.name), ppid, cmdline))
    return members


def kill_group(proc: subprocess.Popen, timeout: float = 20.0) -> int:
    """SIGKILL the whole group; return how many of its processes were still alive ``timeout`` s later."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    return settle(proc.pid, timeout)


def settle(pgid: int, timeout: float = 10.0) -> int:
    """Live members of the group once they have had ``timeout`` s to exit."""
    deadline = time.monotonic() + timeout
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(group_members(pgid))


def rank_processes(proc: subprocess.Popen) -> list[int]:
    """The local ranks of the run ``proc`` launched, by pid: the children of its multiprocessing forkserver
    (``distributed.ranks.run_ranks``)."""
    members = group_members(proc.pid)
    servers = {pid for pid, ppid, cmd in members if ppid == proc.pid and "multiprocessing.forkserver" in cmd}
    return sorted(pid for pid, ppid, _ in members if ppid in servers)


# ---------------------------------------------------------------------------------------------- one trial


def reference_run(spec: RunSpec, cwd: Path, name: str = "reference", timeout: float = 900) -> float:
    """The uninterrupted run; returns its wall time."""
    start = time.monotonic()
    proc = launch(spec, cwd, name)
    if proc.wait(timeout=timeout) != 0:
        raise RuntimeError(f"reference run failed, see {cwd}/{name}.0.log")
    return time.monotonic() - start


def run_trial(
    spec: RunSpec,
    cwd: Path,
    name: str,
    kills: list[KillPoint],
    reference: str,
    reference_s: float,
    rng_seed: int,
    timeout: float = 900,
) -> TrialResult:
    """Launch, kill at each point in turn (each later launch resumes), run to the end, compare."""
    rng = random.Random(rng_seed)
    result, start = TrialResult(name, spec.ranks, []), time.monotonic()
    ckpt = cwd / name / "ckpt"
    for i, point in enumerate(kills):
        env = {PAUSE_ENV: str(point.pause_s)} if point.kind == "checkpoint" else {}
        # A resumed launch has only the steps after the latest checkpoint left to run: scale its moment.
        done = result.kills[-1].steps_on_disk[-1] if i and result.kills[-1].steps_on_disk else 0
        for attempt in range(3 if i == 0 else 1):
            launched = time.monotonic()
            record = kill_at(
                launch(spec, cwd, name, env), point, ckpt, reference_s * max(0.3, (spec.steps - done) / spec.steps), rng
            )
            if record.killed or i > 0 or attempt == 2:
                break
            # The whole run finished before the moment came (the shared machine got faster): start the
            # trial over, timing the moment against the launch just seen (less 10% for its exit).
            reference_s = 0.9 * (time.monotonic() - launched)
            result.restarts += 1
            shutil.rmtree(cwd / name, ignore_errors=True)
            for log in cwd.glob(f"{name}.*.log"):
                log.unlink()
        result.kills.append(record)
    final = launch(spec, cwd, name)
    try:
        result.final_rc = final.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(final)
        result.problems.append("final launch timed out")
    _fill_resume_sources(cwd, name, result)
    _compare(cwd, name, reference, spec.steps, result)
    result.seconds = time.monotonic() - start
    _judge(result)
    return result


def kill_at(proc: subprocess.Popen, point: KillPoint, ckpt: Path, reference_s: float, rng: random.Random) -> KillRecord:
    """Wait for ``point`` in the launch ``proc``, kill, and record what the kill left on disk."""
    launched = time.monotonic()
    if point.kind == "checkpoint":
        planned = f"during the write of step_{point.save}, {point.fraction:.2f} x 4 pauses of {point.pause_s}s"
        tmp = ckpt / f"tmp_step_{point.save}" / point.wait_for
        while not tmp.exists() and proc.poll() is None:
            time.sleep(0.005)
        time.sleep(point.fraction * PAUSES_PER_WRITE * point.pause_s)
    else:
        planned = f"{point.fraction:.2f} x expected wall time ({point.fraction * reference_s:.1f}s)"
        deadline = launched + point.fraction * reference_s
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
    record = KillRecord(point.kind, planned)
    if proc.poll() is not None:  # finished (or failed) before the moment came: nothing was killed
        record.launcher_exited_by_itself = True
        return record
    record.seconds_after_launch = time.monotonic() - launched
    if point.kind == "one_rank":
        ranks = rank_processes(proc)
        if ranks:
            os.kill(rng.choice(ranks), signal.SIGKILL)
            try:
                proc.wait(timeout=120)
                record.launcher_exited_by_itself = True
            except subprocess.TimeoutExpired:
                record.launcher_exited_by_itself = False
    # one_rank: what the launcher left behind when it gave up by itself; otherwise what outlived kill -9.
    survivors = settle(proc.pid) if record.launcher_exited_by_itself else 0
    record.leftover_processes = max(survivors, kill_group(proc))
    record.killed = True
    record.stage = _stage(ckpt)
    _snapshot(ckpt, record)
    return record


def _stage(ckpt: Path) -> str:
    """Where a checkpoint write stood: the newest tmp_step_N's contents, else "between writes"."""
    tmps = sorted(ckpt.glob("tmp_step_*")) if ckpt.is_dir() else []
    if not tmps:
        return "between writes"
    tmp = tmps[-1]
    if (tmp / "manifest.json").exists():
        return f"{tmp.name}: manifest written, before rename"
    if (tmp / "trainer.pt").exists():
        return f"{tmp.name}: weights and trainer state written"
    if (tmp / "weights" / ".metadata").exists():
        return f"{tmp.name}: weights written"
    if (tmp / "weights").exists():
        return f"{tmp.name}: writing weights"
    return f"{tmp.name}: directory created"


def _snapshot(ckpt: Path, record: KillRecord) -> None:
    from dtppo.checkpoint import store as checkpoint
    from dtppo.errors import CheckpointError

    record.steps_on_disk = checkpoint.complete_steps(ckpt)
    record.tmp_dirs = sorted(p.name for p in ckpt.glob("tmp_*")) if ckpt.is_dir() else []
    for step in record.steps_on_disk:
        try:
            checkpoint.verify(ckpt / f"step_{step}")
        except CheckpointError:
            record.step_dirs_verified = False


def _fill_resume_sources(cwd: Path, name: str, result: TrialResult) -> None:
    """Launch i+1's "resumed from .../step_N" line (none: a fresh start) tells where kill i's run resumed."""
    logs = sorted(cwd.glob(f"{name}.*.log"), key=lambda p: int(p.name.split(".")[-2]))
    for record, log in zip(result.kills, logs[1:]):
        line = next((text for text in log.read_text().splitlines() if text.startswith("resumed from ")), None)
        record.resumed_from = int(line.rsplit("step_", 1)[1]) if line else 0


# ---------------------------------------------------------------------------------------------- comparison


def comparable_metrics(path: Path) -> list[dict]:
    """A metrics.jsonl's records without the wall-clock ones (timing/*, perf/*), which no rerun repeats."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(("timing/", "perf/"))} for r in records]


def _compare(cwd: Path, name: str, reference: str, steps: int, result: TrialResult) -> None:
    if result.final_rc != 0:
        return
    mine = comparable_metrics(cwd / name / "log" / "metrics.jsonl")
    ref = comparable_metrics(cwd / reference / "log" / "metrics.jsonl")
    result.metrics_equal = mine == ref
    diffs = [
        abs(a[k] - b[k])
        for a, b in zip(mine, ref)
        for k in a.keys() & b.keys()
        if isinstance(a[k], float) and isinstance(b[k], float)
    ]
    result.max_metric_abs_diff = max(diffs, default=float("nan")) if len(mine) == len(ref) else float("inf")
    a = checkpoint_tensors(cwd / name / "ckpt" / f"step_{steps}")
    b = checkpoint_tensors(cwd / reference / "ckpt" / f"step_{steps}")
    result.weights_equal = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    floats = [k for k in a.keys() & b.keys() if a[k].is_floating_point()]
    result.max_weight_abs_diff = max((float((a[k] - b[k]).abs().max()) for k in floats), default=float("nan"))
    ta, tb = (
        torch.load(cwd / n / "ckpt" / f"step_{steps}" / "trainer.pt", weights_only=True) for n in (name, reference)
    )
    result.trainer_state_equal = (
        ta["rollouts"]["loader"] == tb["rollouts"]["loader"]
        and ta["steps_done"] == tb["steps_done"] == steps
        and ta["policy"] == tb["policy"]
        and ta["value"] == tb["value"]
    )


def _judge(result: TrialResult) -> None:
    for i, kill in enumerate(result.kills):
        if not kill.killed:
            continue
        expected = kill.steps_on_disk[-1] if kill.steps_on_disk else 0
        if kill.resumed_from != expected:
            result.problems.append(f"kill {i}: resumed from step {kill.resumed_from}, latest on disk was {expected}")
        if not kill.step_dirs_verified:
            result.problems.append(f"kill {i}: a step_N directory failed its manifest check")
        if kill.leftover_processes:
            result.problems.append(f"kill {i}: {kill.leftover_processes} processes survived the kill")
        if kill.launcher_exited_by_itself is False:
            result.problems.append(f"kill {i}: the launcher hung after one rank was killed")
    if result.final_rc != 0:
        result.problems.append(f"final launch exited {result.final_rc}")
    for ok, what in [
        (result.metrics_equal, "metrics"),
        (result.weights_equal, "weights"),
        (result.trainer_state_equal, "trainer state"),
    ]:
        if result.final_rc == 0 and not ok:
            result.problems.append(f"{what} differ from the uninterrupted run")
