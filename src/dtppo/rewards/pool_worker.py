"""The scoring pool's worker side, apart from the parent side so that scoring processes import only the reward
functions (``dtppo.rewards.functions``: the built-ins are about 60 MiB and under a second), never torch (about
250 MiB, seconds), unless a user's function does."""

from __future__ import annotations

import os

from dtppo.rewards.functions import load_functions, score_job
from dtppo.rewards.verifiers.gsm8k import gsm8k_reward
from dtppo.usercode.given import GivenInputs
from dtppo.usercode.sandbox import confine, exit_if_forked

OUTPUT_CAP = "reward function output (reward.max_print_bytes)"  # names the cap in its notice


def serve(conn, specs: list[str], given: GivenInputs | None, memory_limit_mib: int, max_print_bytes: int) -> None:
    """A scoring process: bound itself (``sandbox.confine``), load the functions ``specs`` name (``given``: those
    passed in Python, pickled by value), build
    math-verify's parser (its first use is the slow one), report ``("ready", pid)``, then answer each chunk
    ``(offset, prompts, completions, columns)`` with ``score_job``'s answer (saying ``("at", spec)`` before each
    function runs) until it receives None or its parent goes away."""
    output = confine(memory_limit_mib, max_print_bytes, OUTPUT_CAP)
    try:
        functions = load_functions(specs, given)
    except Exception as err:  # the parent loaded them first, so only a file changed since fails here
        functions, failure = None, str(err)
    gsm8k_reward("\\boxed{\\frac{1}{2}}", "0.5")
    pid = os.getpid()

    def announce(spec: str) -> None:
        exit_if_forked(pid)  # a copy the user's code forked must not write on this pipe
        conn.send(("at", spec))

    try:
        conn.send(("ready", pid))
        while (job := conn.recv()) is not None:
            output.start_job()
            if functions is None:
                answer = ("error", failure)
            else:
                answer = score_job(functions, job, announce)
            exit_if_forked(pid)
            output.flush()
            conn.send(("answer", answer))
    except (EOFError, OSError):  # the parent is gone (its run stopped): nothing is left to answer
        return
