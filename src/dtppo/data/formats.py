"""The row formats of the file-backed tasks: the GSM8K and MATH presets and a custom format from the config.

All three go through the same reader (``data.rows``); a preset fixes its columns and how its reference is read.
"""

from __future__ import annotations

import re
from typing import Any

from dtppo.config import DataConfig
from dtppo.data.answers import extract_gsm8k_answer, last_boxed
from dtppo.data.rows import RowFormat

# The reference answers the GSM8K verifier compares exactly (after "1,000" -> "1000"): GSM8K's are integers.
_NUMBER = re.compile(r"[-+]?[0-9]+(?:\.[0-9]+)?")


def _gsm8k_reference(solution: Any) -> tuple[str | None, str | None]:
    """The number after a worked solution's last ``####``."""
    if not isinstance(solution, str):
        return None, "missing_answer"
    if "####" not in solution:
        return None, "no_answer_line"
    answer = extract_gsm8k_answer(solution)
    if not answer:
        return None, "empty_answer"
    if not _NUMBER.fullmatch(answer):
        return None, "non_numeric_answer"
    return answer, None


def _math_reference(solution: Any) -> tuple[str | None, str | None]:
    """The body of a MATH solution's last ``\\boxed{}`` (or ``\\fbox{}``)."""
    if not isinstance(solution, str):
        return None, "missing_solution"
    answer = last_boxed(solution)
    return (answer.strip(), None) if answer and answer.strip() else (None, "no_boxed_answer")


def _as_is(value: Any) -> tuple[Any, None]:
    return value, None


GSM8K = RowFormat("GSM8K", "question", "answer", _gsm8k_reference, solution_key="answer")
MATH = RowFormat("MATH", "problem", "solution", _math_reference, solution_key="solution")


def row_format(data: DataConfig) -> RowFormat:
    """The format ``data.task`` reads its rows in (a file-backed task: not tiny_math)."""
    if data.task == "gsm8k":
        return GSM8K
    if data.task == "math":
        return MATH
    # The reference column is also the target SFT trains on (the completion a TRL prompt-completion row holds).
    return RowFormat("custom", data.prompt_key, data.answer_key, _as_is, solution_key=data.answer_key, preset=False)
