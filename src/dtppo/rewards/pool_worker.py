"""The scoring pool's worker side, apart from the parent side so that scoring processes import only the reward
functions (``dtppo.rewards.functions``: the built-ins are about 60 MiB and under a second), never torch (about
250 MiB, seconds), unless a user's function does."""

from __future__ import annotations

import os

from dtppo.rewards.functions import load_functions, score_job
from dtppo.rewards.verifiers.gsm8k import gsm8k_reward


def serve(conn, specs: list[str]) -> None:
    """A scoring process: load the functions ``specs`` name, build math-verify's parser (its first use is the slow
    one), report ``("ready", pid)``, then answer each chunk ``(offset, prompts, completions, columns)`` with
    ``("scores", score_job(...))`` until it receives None or its parent goes away."""
    try:
        functions = load_functions(specs)
    except Exception as err:  # the parent loaded them first, so only a file changed since fails here
        functions, failure = None, str(err)
    gsm8k_reward("\\boxed{\\frac{1}{2}}", "0.5")
    try:
        conn.send(("ready", os.getpid()))
        while (job := conn.recv()) is not None:
            conn.send(("scores", score_job(functions, job) if functions is not None else ("error", failure)))
    except (EOFError, OSError):  # the parent is gone (its run stopped): nothing is left to answer
        return
