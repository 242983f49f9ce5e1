"""An environment process: bound itself, build the environment once, then answer jobs (``interface.run_job``) on its
pipe."""

from __future__ import annotations

import os

from dtppo.envs.interface import EnvironmentFailure, load_environment, run_job
from dtppo.usercode.sandbox import confine, exit_if_forked

OUTPUT_CAP = "environment output (env.max_print_bytes)"  # names the cap in its notice


def serve(conn, spec: str, kwargs: dict, memory_limit_mib: int, max_print_bytes: int) -> None:
    """Report ``("ready", pid)``, then answer each job with ``("answer", run_job(...))`` until None arrives or the
    parent goes away, under ``env.memory_limit_mib`` and ``env.max_print_bytes`` (``sandbox.confine``). A class that
    fails to build answers every job with its error (the parent built it first, so only a file changed since
    fails here)."""
    output = confine(memory_limit_mib, max_print_bytes, OUTPUT_CAP)
    try:
        env, failure = load_environment(spec, kwargs), None
    except EnvironmentFailure as err:
        env, failure = None, str(err)
    pid = os.getpid()
    try:
        conn.send(("ready", pid))
        while (job := conn.recv()) is not None:
            output.start_job()
            answer = run_job(spec, env, job) if env is not None else ("error", failure)
            exit_if_forked(pid)  # a copy the environment forked must not answer on this pipe
            output.flush()
            conn.send(("answer", answer))
    except (EOFError, OSError):  # the parent is gone (its run stopped): nothing is left to answer
        return
