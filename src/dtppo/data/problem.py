"""The record every data source yields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Messages = list[dict[str, str]]  # chat messages [{"role": ..., "content": ...}] (TRL's "conversational" rows)
Prompt = str | Messages


@dataclass(frozen=True)
class Problem:
    """question: the prompt, text or chat messages; solution: a worked answer SFT trains on ("" if none);
    answer: the reference the verifier compares (None if the task has none); columns: every other column of the
    row it came from, passed to reward functions as keywords (the prompt itself is their ``prompts``)."""

    question: Prompt
    solution: str
    answer: Any
    columns: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def conversational(self) -> bool:
        return isinstance(self.question, list)
