"""Bounds on the user's code in the processes that run it: scoring processes, environment processes and Ray scoring
actors (docs/guides/reliability.md, "User code that fails badly").

- memory: ``RLIMIT_DATA`` (Linux counts the heap and every private writable mapping in it) set to what the process
  holds once started plus the configured headroom, so a runaway allocation fails inside that process
  (``MemoryError``, or the process dies) instead of taking the machine; and the kernel's OOM killer is told to pick
  that process before the trainer (``oom_score_adj`` 1000);
- output: what the code writes to stdout and stderr (``print``, C extensions, subprocesses alike) passes through a
  pipe, and at most ``max_print_bytes`` of it per job reaches the run's log; the rest is dropped with one notice;
- processes it forks: a copy of the serving process that returns from the user's function is stopped before it
  can answer on the parent's pipe (``exit_if_forked``); a pool process leads its own process group, which is
  killed with it, and dies with its parent (``PR_SET_PDEATHSIG``).

Linux enforces all of it; elsewhere the memory limit and the parent-death signal are not available and are skipped.
Light on purpose: these processes never import torch.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
import threading

_PR_SET_PDEATHSIG = 1


def confine(memory_limit_mib: int, max_print_bytes: int, what: str) -> OutputCap:
    """Apply the output cap and the memory limit (0 = none) to this process, before the user's code loads; ``what``
    names the code in the notice of dropped output (e.g. "reward function output", with the config key)."""
    output = OutputCap(max_print_bytes, what)  # its threads' stacks belong to the process's own start-up size
    limit_memory(memory_limit_mib)
    _prefer_for_oom_killer()
    return output


def limit_memory(mib: int) -> None:
    """From now on this process (and whatever it forks) may hold ``mib`` MiB of data more than it holds now (a pool
    process about 55 MiB, a Ray actor about 220 MiB: its threads); 0 = no limit. Linux only."""
    if mib <= 0 or not sys.platform.startswith("linux"):
        return
    status = open("/proc/self/status").read()
    held = int(next(line for line in status.splitlines() if line.startswith("VmData:")).split()[1]) * 1024
    size = held + mib * 2**20
    # hard = soft: the user's code cannot raise it again
    resource.setrlimit(resource.RLIMIT_DATA, (size, size))


def _prefer_for_oom_killer() -> None:
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")
    except OSError:  # not Linux, or a sandbox that forbids it: the memory limit still applies
        pass


def lead_process_group() -> None:
    """A pool process: its own process group (so ``kill_group`` reaches whatever the user's code forked) and killed
    when the parent that spawned it dies, even by SIGKILL (Linux). The kernel ties the signal to the spawning
    thread: pools are built and refilled by the thread that runs the trainer, which lives as long as the run."""
    parent = os.getppid()
    os.setpgid(0, 0)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)


def kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads (a pool process and what it forked); nothing if it is gone."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def exit_if_forked(pid: int) -> None:
    """Called after the user's code returns: in a copy of the process it forked (pid differs), exit at once, so
    that only the serving process ever answers on the pipe both hold."""
    if os.getpid() != pid:
        os._exit(0)


def describe_exit(exitcode: int | None) -> str:
    """A dead process's end as a user reads it: "exit code 3", "signal 11 (SIGSEGV)"."""
    if exitcode is None:
        return "no exit status"
    if exitcode < 0:
        try:
            return f"signal {-exitcode} ({signal.Signals(-exitcode).name})"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


class OutputCap:
    """File descriptors 1 and 2 of this process are pipes, drained by two threads into the original stdout and
    stderr; per job (``start_job``) at most ``limit`` bytes of the two together pass, and the first byte past it
    writes one notice instead. Output still in flight when the next job starts counts against that job."""

    def __init__(self, limit: int, what: str):
        self.limit, self.what = limit, what
        self.lock = threading.Lock()
        self.passed, self.dropping = 0, False
        for fd in (1, 2):
            getattr(sys, "stdout" if fd == 1 else "stderr").flush()
            original = os.dup(fd)
            read, write = os.pipe()
            os.dup2(write, fd)
            os.close(write)
            threading.Thread(target=self._drain, args=(read, original), daemon=True).start()

    def start_job(self) -> None:
        """What the code writes from now on counts against a fresh allowance."""
        self.flush()
        with self.lock:
            self.passed, self.dropping = 0, False

    def flush(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # the user's code closed or broke a stream: nothing to save
                pass

    def _drain(self, read: int, out: int) -> None:
        while data := os.read(read, 65536):
            with self.lock:
                kept = data[: max(0, self.limit - self.passed)]
                self.passed += len(kept)
                notice = not self.dropping and len(kept) < len(data)
                self.dropping = self.dropping or notice
            if kept:
                _write_all(out, kept)
            if notice:
                _write_all(out, f"\n[dtppo: {self.what} past {self.limit} bytes in this job is dropped]\n".encode())


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:  # the log went away (the run is stopping): the output has nowhere to go
        pass
