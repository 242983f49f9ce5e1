"""The scoring pool's worker side, apart from the parent side so that scoring processes import only the
reward (``dtppo.rewards.math``: about 60 MiB and under a second), never torch (about 250 MiB, seconds)."""

from __future__ import annotations

import os

from dtppo.rewards.math import gsm8k_reward, gsm8k_rewards


def serve(conn) -> None:
    """A scoring process: build math-verify's parser (its first use is the slow one), report
    ``("ready", pid)``, then answer each ``(responses, ground_truths)`` job with ``("scores", [...])``
    until it receives None or its parent goes away."""
    gsm8k_reward("\\boxed{\\frac{1}{2}}", "0.5")
    conn.send(("ready", os.getpid()))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        conn.send(("scores", gsm8k_rewards(*job)))
