"""The record every data source yields."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """question: the user text; solution: a worked answer ending in ``#### N``; answer: N as text."""

    question: str
    solution: str
    answer: str
