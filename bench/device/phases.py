"""The device check as phases under one deadline (bench/device/check.py).

A device session has a few minutes per command and a killed command returns only what it had written, so each
phase runs in its own try/except (its error and traceback recorded, the next phase still runs), the JSON is
rewritten atomically after every phase, a phase that would start past the deadline is recorded as skipped, and
every child process a phase starts gets a timeout that ends inside the deadline (``DEADLINE.timeout``).
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from bench.common.record import write_json

SKIPPED_PAST_DEADLINE = {"skipped": "deadline"}
# What a child needs beyond its timeout to be killed and reaped, and the phase to record it.
CHILD_MARGIN_S = 5.0


class Deadline:
    """Seconds from ``start()``; no limit until started with a number."""

    def __init__(self) -> None:
        self.end = math.inf

    def start(self, seconds: float | None) -> None:
        self.end = math.inf if seconds is None else time.monotonic() + seconds

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def timeout(self, cap: float) -> float:
        """A child's timeout: ``cap``, shortened so that it ends inside the deadline (at least 1 s, so that a child
        started just before the deadline fails by its timeout rather than by an invalid argument)."""
        return max(1.0, min(cap, self.remaining() - CHILD_MARGIN_S))


DEADLINE = Deadline()


def phase_passed(outcome: dict) -> bool:
    """A phase passed when it ran without an error and did not report a failure; a phase skipped for this machine
    (e.g. CUDA-only on the CPU fallback) passes, one skipped past the deadline does not."""
    if outcome == SKIPPED_PAST_DEADLINE or "error" in outcome:
        return False
    return "skipped" in outcome or outcome.get("passed", True) is not False


def run_phases(
    phases: list[tuple[str, Callable[[], dict]]],
    record: dict,
    out: Path,
    on_phase: Callable[[str, dict], None],
) -> dict:
    """Run ``phases`` in order into ``record["phases"]``, writing ``out`` after each; ``on_phase(name, outcome)``
    reports each as it ends. Every outcome gets ``seconds``. Returns ``record``."""
    record["phases"] = {}
    for name, run in phases:
        if DEADLINE.remaining() <= 0:
            outcome = dict(SKIPPED_PAST_DEADLINE)
        else:
            start = time.monotonic()
            try:
                outcome = run()
            except Exception as error:  # noqa: BLE001 - a phase's failure is its result; the next phase runs
                outcome = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-3000:]}
            outcome["seconds"] = time.monotonic() - start
        record["phases"][name] = outcome
        record["passed"] = all(phase_passed(o) for o in record["phases"].values())
        write_json(out, record, indent=2)
        on_phase(name, outcome)
    return record
