"""Chunks that could not be scored, and when a run whose rewards keep failing stops (docs/guides/reliability.md,
"User code that fails badly").

A chunk fails when its scoring process died under it (twice: ``crashed``, with the exit code or signal), it was not
scored within ``reward.timeout_s`` (``timed_out``), a function raised on it (``raised``) or ran past
``reward.memory_limit_mib`` (``out_of_memory``). Its samples get no score: they leave training and the reward means,
so a failure is never read as a reward of 0 (and a reward of 0 is never a failure). A function that returns unusable
scores is not a failed chunk but a broken contract: the run stops at once (``functions.RewardFunctionError``).

``FailureBudget`` names the first failure of each kind in a step (one line, not one per chunk) and decides, at the end
of each step, whether the failures over the last ``reward.failure_window`` steps exceed
``reward.max_failed_fraction`` of the chunks scored. No torch: pure bookkeeping.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass

from dtppo.errors import InputError

log = logging.getLogger(__name__)

_WHAT = {
    "crashed": "crashed (its process died: {})",
    "timed_out": "timed out ({})",
    "raised": "raised {}",
    "out_of_memory": "ran out of memory ({})",
}


class RewardFailureError(InputError):
    """The reward functions failed on more chunks than ``reward.max_failed_fraction`` allows (exit 2: the user's code
    is an input); names the function, the kind and the checkpoint of the last step."""


@dataclass(frozen=True)
class ChunkFailure:
    """One chunk that got no scores. kind: one of ``reward_spec.FAILURE_KINDS``; function: the spec it failed in
    (several, comma-separated, when the process died without saying which it ran); detail: the exit code or signal,
    the exception, the time bound; first, size: the chunk's samples (indices in the batch); prompt: the first
    sample's prompt, shortened."""

    kind: str
    function: str
    detail: str
    first: int
    size: int
    prompt: str

    def describe(self) -> str:
        """One line: the function, what happened and where."""
        what = _WHAT[self.kind].format(self.detail)
        last = self.first + self.size - 1
        return f"reward function {self.function!r} {what} on samples {self.first}..{last} (prompt {self.prompt!r})"


class FailureBudget:
    """Chunks scored and failed per step over the last ``window`` steps (rank 0, where the scoring runs).

    ``record`` adds a scored batch's chunks (every call of a step: dynamic sampling's extra batches and the
    validation too); ``end_step`` closes the step and returns why the run must stop, or None. The fraction is
    ``failed / chunks`` over the window, where a window not yet full counts its missing steps as chunks that
    succeeded at the current rate, ``failed · k / (chunks · window)`` after k steps, except after the run's last
    step (no more steps will come): a short run whose rewards mostly failed does not end as if it had succeeded."""

    def __init__(self, max_failed_fraction: float, window: int):
        self.max_failed_fraction, self.window = max_failed_fraction, window
        self.steps: collections.deque[tuple[int, list[tuple[str, str, str]]]] = collections.deque(maxlen=window)
        self.chunks, self.failures = 0, []
        self.named: set[str] = set()  # kinds named this step

    def record(self, chunks: int, failures: list[ChunkFailure]) -> None:
        """A batch of ``chunks`` chunks was scored, ``failures`` of them failed: name each kind's first of the step."""
        self.chunks += chunks
        self.failures += [(f.function, f.kind, f.detail) for f in failures]
        for failure in failures:
            if failure.kind not in self.named:
                self.named.add(failure.kind)
                log.warning("%s; its samples leave training", failure.describe())

    def end_step(self, last: bool = False) -> str | None:
        """Close the step (``last``: the run's final one): the one-line reason to stop the run, or None to go on."""
        self.steps.append((self.chunks, self.failures))
        self.chunks, self.failures, self.named = 0, [], set()
        chunks = sum(n for n, _ in self.steps)
        failures = [f for _, step in self.steps for f in step]
        counted = self.window if not last else len(self.steps)  # steps the window's chunks are spread over
        if not failures or len(failures) * len(self.steps) <= self.max_failed_fraction * chunks * counted:
            return None
        (function, kind), count = collections.Counter((f, k) for f, k, _ in failures).most_common(1)[0]
        detail = next(d for f, k, d in reversed(failures) if (f, k) == (function, kind))
        return (
            f"reward function {function!r} {_WHAT[kind].format(detail)} on {count} chunk(s); {len(failures)} of the "
            f"{chunks} chunks scored in the last {len(self.steps)} step(s) failed, more than reward.max_failed_fraction"
            f" = {self.max_failed_fraction:g} of reward.failure_window = {self.window} steps allows"
        )

    def state_dict(self) -> dict:
        """The window (completed steps only: a checkpoint is written between steps)."""
        return {"steps": [[n, [list(f) for f in step]] for n, step in self.steps]}

    def load_state_dict(self, state: dict | None) -> None:
        self.steps.clear()
        if not state:  # a checkpoint written before the failure budget: an empty window
            return
        self.steps.extend((int(n), [tuple(f) for f in step]) for n, step in state["steps"])
