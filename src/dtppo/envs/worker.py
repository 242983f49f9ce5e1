"""An environment process: build the environment once, then answer jobs (``interface.run_job``) on its pipe."""

from __future__ import annotations

import os

from dtppo.envs.interface import EnvironmentFailure, load_environment, run_job


def serve(conn, spec: str, kwargs: dict) -> None:
    """Report ``("ready", pid)``, then answer each job with ``("answer", run_job(...))`` until None arrives or the
    parent goes away. A class that fails to build answers every job with its error (the parent built it first,
    so only a file changed since fails here)."""
    try:
        env, failure = load_environment(spec, kwargs), None
    except EnvironmentFailure as err:
        env, failure = None, str(err)
    try:
        conn.send(("ready", os.getpid()))
        while (job := conn.recv()) is not None:
            conn.send(("answer", run_job(spec, env, job) if env is not None else ("error", failure)))
    except (EOFError, OSError):  # the parent is gone (its run stopped): nothing is left to answer
        return
