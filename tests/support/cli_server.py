"""A process that has imported the stack once and forks one child per ``dtppo`` command the tests run.

Starting Python and importing torch, transformers and dtppo takes about 6 s of a tiny CLI run's 8.5 s on 2 cores.
This server pays it once per pytest session: ``python -m tests.support.cli_server`` imports what ``dtppo ppo`` and
``dtppo sft`` load, runs no torch operation (so no thread pool exists to be copied half-locked into a child), and then
reads one request per line on stdin: ``{"argv": [...], "cwd": ..., "env": {...}, "stdout": path, "stderr": path,
"timeout": s}``. For each it forks a child that becomes the command a user runs: the working directory, the
environment (what ``python -m dtppo`` would inherit), ``sys.argv`` and file descriptors 1 and 2 redirected to the two
files, so C code and subprocesses write there too. The child calls ``dtppo.cli.main`` exactly as ``python -m dtppo``
does, runs the interpreter's exit handlers and exits with the command's exit code. The server answers one line,
``{"returncode": n}``, or ``{"timeout": true}`` after killing a child (its process group) past its timeout.

Environment variables that the stack reads when it is imported cannot reach a forked child; a request that sets one
(``IMPORT_TIME_ENV``) is refused by the client, which runs a fresh interpreter instead (tests/support/cli.py).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time

# Read when torch, its kernels or Python start, not when a command runs: a request setting one gets a fresh process.
IMPORT_TIME_ENV = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "PYTHONPATH",
    "PYTHONHASHSEED",
)


def _preload() -> None:
    """What ``dtppo ppo``, ``dtppo sft``, ``eval`` and ``export`` import, without running a torch operation."""
    import dtppo.checkpoint.export  # noqa: F401
    import dtppo.cli  # noqa: F401
    import dtppo.launch.launcher  # noqa: F401
    import dtppo.launch.preflight  # noqa: F401
    import dtppo.ppo.entry  # noqa: F401
    import dtppo.ppo.trainer  # noqa: F401
    import dtppo.sft.trainer  # noqa: F401


def _child(request: dict, answers: int) -> None:
    """Become ``dtppo ARGV`` run in ``cwd`` with ``env``; never returns. ``answers``: the server's reply pipe, which
    the command must not hold."""
    os.setpgid(0, 0)  # its own process group: a timeout kills the command and whatever it started
    code = 1
    try:
        os.close(answers)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(line_buffering=True)
        sys.argv = [sys.executable, *request["argv"]]
        from dtppo.cli import main

        try:
            main(request["argv"])
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            if not isinstance(stop.code, int | None):
                print(stop.code, file=sys.stderr)
        except BaseException:  # what the interpreter prints for an uncaught exception, and its exit status
            import traceback

            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _wait(pid: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return {"returncode": os.waitstatus_to_exitcode(status)}
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return {"timeout": True}
        time.sleep(0.02)


def serve() -> None:
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever the imports print stays off the reply pipe
    _preload()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request, answers.fileno())
        answers.write(json.dumps(_wait(pid, request["timeout"])) + "\n")


if __name__ == "__main__":
    serve()
