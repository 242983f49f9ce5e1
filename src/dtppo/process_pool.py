"""ProcessPool: worker processes for user code (reward functions, environments), each on its own pipe, with a
deadline per batch.

Why not ``multiprocessing.Pool`` or ``ProcessPoolExecutor``: a Pool worker killed while it waits for work
holds the shared task-queue lock, and every other worker then blocks forever; an executor whose worker dies
is broken for good and raises on every later batch. Here a worker shares nothing with its siblings: one
that misses the deadline is terminated and replaced and its job scores None; one that dies (OOM killer, a
crash) is replaced and its job retried once (a job that kills two workers scores None); the other workers
carry on. A worker holds one job at a time, so its memory is bounded by a job's size.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait

log = logging.getLogger(__name__)

_TRIES = 2  # runs of a job whose worker died under it, before it scores None


class _Worker:
    def __init__(self, ctx, target: Callable, args: tuple, name: str):
        self.conn, child = ctx.Pipe()
        # daemon: a trainer that exits without close() does not leave scoring processes behind.
        self.proc = ctx.Process(target=target, args=(child, *args), daemon=True, name=name)
        self.proc.start()
        child.close()  # the parent keeps one end only, so a dead worker reads as EOF here
        self.pid: int | None = None  # set when the worker reports ready
        self.job: int | None = None  # index of the job it holds

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.join(1.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


class _Batch:
    """One ``map`` call's state: the jobs, those not yet handed out, results, and deaths per job."""

    def __init__(self, jobs: list[tuple]):
        self.jobs = jobs
        self.todo = collections.deque(range(len(jobs)))
        self.results: list[object | None] = [None] * len(jobs)
        self.tries = [0] * len(jobs)


class ProcessPool:
    """``num_workers`` spawned processes, each running ``target(conn, *args)`` (``rewards.pool_worker.serve``,
    ``envs.worker.serve``): a target reports ``("ready", pid)``, then answers each job with one ``(kind, answer)``
    message, until it receives None. ``map`` runs jobs within a deadline."""

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

    def map(self, jobs: list[tuple], timeout_s: float) -> list[object | None]:
        """Each job's answer (``pool_worker.serve``), or None for a job not done within ``timeout_s`` or that killed
        its worker twice."""
        batch = _Batch(jobs)
        deadline = time.monotonic() + timeout_s
        self._dispatch(batch)
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
                self._replace(i)
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
                worker.job = job
            except OSError:  # died while idle: the job goes back to the queue
                batch.todo.appendleft(job)
                self._replace(i)

    def _receive(self, index: int, batch: _Batch) -> None:
        worker = self.workers[index]
        try:
            kind, payload = worker.conn.recv()
        except (EOFError, OSError):  # the process died, maybe before it even saw its job: retry that once
            if worker.job is not None:
                batch.tries[worker.job] += 1
                if batch.tries[worker.job] < _TRIES:
                    batch.todo.append(worker.job)
            self._replace(index)
            return
        if kind == "ready":
            worker.pid = payload
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
