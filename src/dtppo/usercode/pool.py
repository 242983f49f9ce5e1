"""ProcessPool: worker processes for user code (reward functions, environments), each on its own pipe, with a
deadline per batch.

Why not ``multiprocessing.Pool`` or ``ProcessPoolExecutor``: a Pool worker killed while it waits for work
holds the shared task-queue lock, and every other worker then blocks forever; an executor whose worker dies
is broken for good and raises on every later batch. Here a worker shares nothing with its siblings: one
that misses the deadline is killed and replaced and its job fails as ``timed_out``; one that dies (a crash,
``os._exit``, the memory limit, the OOM killer) is replaced and its job retried once (a job that kills two
workers fails as ``crashed``, with the second death's exit code or signal); the other workers carry on. A worker
holds one job at a time, so its memory is bounded by a job's size. Each worker leads its own process group, so
what the user's code forked is killed with it (``sandbox``).
"""

from __future__ import annotations

import collections
import logging
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from dtppo.usercode.sandbox import describe_exit, kill_group, lead_process_group

log = logging.getLogger(__name__)

_TRIES = 2  # runs of a job whose worker died under it, before it fails as crashed
_EXIT_WAIT_S = 2.0  # how long a worker whose pipe closed is given to finish dying, for its exit status


@dataclass(frozen=True)
class JobFailure:
    """Why a job has no answer. kind: ``crashed`` (its process died twice under it; ``detail`` the last death's exit
    code or signal) or ``timed_out`` (not answered within the batch's deadline); label: what the worker last said it
    was running (an ``("at", label)`` message; None if it said nothing)."""

    kind: str
    detail: str
    label: str | None


def _run(target: Callable, conn: Connection, *args) -> None:
    lead_process_group()
    target(conn, *args)


class _Worker:
    def __init__(self, ctx, target: Callable, args: tuple, name: str):
        self.conn, child = ctx.Pipe()
        # daemon: a trainer that exits without close() does not leave worker processes behind.
        self.proc = ctx.Process(target=_run, args=(target, child, *args), daemon=True, name=name)
        self.proc.start()
        child.close()  # the parent keeps one end only, so a dead worker reads as EOF here
        self.pid: int | None = None  # set when the worker reports ready
        self.job: int | None = None  # index of the job it holds
        self.label: str | None = None  # what it said it is running

    def exit_status(self) -> str:
        """How the process ended ("exit code 3", "signal 11 (SIGSEGV)"), waiting a little for it to finish dying."""
        self.proc.join(_EXIT_WAIT_S)
        return describe_exit(self.proc.exitcode)

    def stop(self) -> None:
        self.proc.kill()
        kill_group(self.proc.pid)  # what the user's code forked, in the worker's process group
        self.proc.join()
        self.conn.close()


class _Batch:
    """One ``map`` call's state: the jobs, those not yet handed out, results, and deaths per job."""

    def __init__(self, jobs: list[tuple]):
        self.jobs = jobs
        self.todo = collections.deque(range(len(jobs)))
        self.results: list[object] = [None] * len(jobs)
        self.tries = [0] * len(jobs)


class ProcessPool:
    """``num_workers`` spawned processes, each running ``target(conn, *args)`` (``rewards.pool_worker.serve``,
    ``envs.worker.serve``): a target reports ``("ready", pid)``, then answers each job with one ``(kind, answer)``
    message (after any number of ``("at", label)`` messages saying what it runs), until it receives None. ``map``
    runs jobs within a deadline."""

    def __init__(self, num_workers: int, target: Callable, args: tuple, name: str):
        # spawn, not fork: the trainer process holds threads (torch, gloo) that a fork would copy mid-state.
        self._ctx = multiprocessing.get_context("spawn")
        self._start = lambda: _Worker(self._ctx, target, args, name)
        self.workers = [self._start() for _ in range(num_workers)]

    @property
    def worker_pids(self) -> list[int]:
        return [w.pid for w in self.workers if w.pid is not None]

    def wait_ready(self, timeout_s: float) -> None:
        """Wait until every worker has started (at most ``timeout_s``): start-up is not scoring time."""
        deadline = time.monotonic() + timeout_s
        while (waiting := [w.conn for w in self.workers if w.pid is None]) and time.monotonic() < deadline:
            for conn in wait(waiting, timeout=max(0.0, deadline - time.monotonic())):
                self._receive(self._owner(conn), _Batch([]))
        if any(w.pid is None for w in self.workers):
            log.warning(
                "process pool: %d of %d processes started within %.0f s",
                len(self.worker_pids),
                len(self.workers),
                timeout_s,
            )

    def map(self, jobs: list[tuple], timeout_s: float, while_waiting: Callable[[], None] | None = None) -> list[object]:
        """Each job's answer, or a ``JobFailure`` for a job not answered within ``timeout_s`` or that killed its
        worker twice. ``while_waiting`` runs in this process once the first jobs are handed out."""
        batch = _Batch(jobs)
        deadline = time.monotonic() + timeout_s
        self._dispatch(batch)
        if while_waiting is not None:
            while_waiting()
        while busy := [w.conn for w in self.workers if w.job is not None or (w.pid is None and batch.todo)]:
            remaining = deadline - time.monotonic()
            ready = wait(busy, timeout=remaining) if remaining > 0 else []
            if not ready:
                break
            for conn in ready:
                self._receive(self._owner(conn), batch)
            self._dispatch(batch)
        for i, worker in enumerate(self.workers):
            if worker.job is not None:  # late: it is stuck on a job, so it cannot be trusted with the next
                batch.results[worker.job] = JobFailure("timed_out", f"no answer within {timeout_s:g} s", worker.label)
                self._replace(i)
        for job in batch.todo:  # never handed out: no worker started in time
            batch.results[job] = JobFailure("timed_out", f"no process free within {timeout_s:g} s", None)
        return batch.results

    def _dispatch(self, batch: _Batch) -> None:
        """Hand the next jobs to idle, started workers; a worker found dead is replaced."""
        for i, worker in enumerate(self.workers):
            if not batch.todo:
                return
            if worker.pid is None or worker.job is not None:
                continue
            job = batch.todo.popleft()
            try:
                worker.conn.send(batch.jobs[job])
                worker.job, worker.label = job, None
            except OSError:  # died while idle: the job goes back to the queue
                batch.todo.appendleft(job)
                self._replace(i)

    def _receive(self, index: int, batch: _Batch) -> None:
        worker = self.workers[index]
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):  # the process died, maybe before it even saw its job: retry that once
            if worker.job is not None:
                batch.tries[worker.job] += 1
                if batch.tries[worker.job] < _TRIES:
                    batch.todo.append(worker.job)
                else:
                    batch.results[worker.job] = JobFailure("crashed", worker.exit_status(), worker.label)
            self._replace(index)
            return
        kind, payload = message
        if kind == "ready":
            worker.pid = payload
        elif kind == "at":
            worker.label = payload
        else:
            batch.results[worker.job], worker.job = payload, None

    def _owner(self, conn: Connection) -> int:
        return next(i for i, w in enumerate(self.workers) if w.conn is conn)

    def _replace(self, index: int) -> None:
        self.workers[index].stop()
        self.workers[index] = self._start()

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers = []
