"""GSM8K rows ``{"question", "answer"}`` (final answer after ``####``) from a jsonl file or any row source.

A bad row can never reach a training step: it is counted by reason and skipped (``on_bad_row="skip"``, the
default), or refused with a ``DataError`` naming the file and line, or the dataset row (``"error"``). Bad rows
are: not JSON, not an object, a missing/empty/non-string question or answer, no ``####`` line, an empty or
non-numeric final answer (a reference the reward could never match), and a prompt longer than
``max_prompt_tokens``.
"""

from __future__ import annotations

import collections
import json
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dtppo.data.problem import Problem
from dtppo.faults import InputError
from dtppo.rewards.math import extract_gsm8k_answer

log = logging.getLogger(__name__)

# The reference answers the reward compares exactly (after "1,000" -> "1000"): GSM8K's are integers.
_NUMBER = re.compile(r"[-+]?[0-9]+(?:\.[0-9]+)?")


class DataError(InputError, ValueError):
    """A data source is unusable; the message names the file or dataset (and the row, for a bad row)."""


@dataclass(frozen=True)
class RowRules:
    """What makes a row bad beyond its format, and what to do with one.

    prompt_length: tokens of a question's formatted prompt (as the trainer encodes it); None = unchecked."""

    on_bad_row: Literal["skip", "error"] = "skip"
    max_prompt_tokens: int | None = None
    prompt_length: Callable[[str], int] | None = None


def load_gsm8k(path: str | Path, limit: int | None = None, rules: RowRules = RowRules()) -> list[Problem]:
    """The usable problems of a GSM8K jsonl file (the first ``limit`` of them); see ``read_gsm8k``."""
    return read_gsm8k(path, limit, rules)[0]


def read_gsm8k(path: str | Path, limit: int | None = None,
               rules: RowRules = RowRules()) -> tuple[list[Problem], collections.Counter]:
    """(usable problems, bad-row count per reason). Blank lines are not rows. Raises FileNotFoundError for a
    missing file, DataError for a bad row under ``on_bad_row="error"`` or a file without one usable row."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GSM8K file not found: {path}")
    with path.open(encoding="utf-8", errors="replace") as fh:
        rows = ((f"{path}:{lineno}", _decode(line)) for lineno, line in enumerate(fh, start=1) if line.strip())
        return collect_rows(rows, str(path), limit, rules)


def collect_rows(rows: Iterable[tuple[str, Any]], source: str, limit: int | None,
                 rules: RowRules) -> tuple[list[Problem], collections.Counter]:
    """(usable problems, bad-row count per reason) of ``(where, row)`` pairs: ``where`` locates a row in its
    source for the error message (``file:line``), ``row`` is its decoded value (``INVALID_JSON`` if none)."""
    problems: list[Problem] = []
    bad: collections.Counter = collections.Counter()
    for where, row in rows:
        problem, reason = _parse_row(row, rules)
        if reason is not None:
            if rules.on_bad_row == "error":
                raise DataError(f"{where}: bad GSM8K row ({reason}); fix it, or set "
                                f"data.on_bad_row=skip to skip such rows")
            bad[reason] += 1
            continue
        problems.append(problem)
        if limit is not None and len(problems) == limit:
            break
    reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(bad.items()))
    if not problems:
        raise DataError(f"{source}: no usable rows ({sum(bad.values())} bad{': ' if bad else ''}{reasons})")
    if bad:
        log.warning("%s: skipped %d bad rows (%s)", source, sum(bad.values()), reasons)
    return problems, bad


INVALID_JSON = object()  # the decoded value of a line that is not JSON


def _decode(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return INVALID_JSON


def _parse_row(row: Any, rules: RowRules) -> tuple[Problem | None, str | None]:
    """(problem, None) for a good row, (None, reason) for a bad one."""
    if row is INVALID_JSON:
        return None, "invalid_json"
    if not isinstance(row, dict):
        return None, "not_an_object"
    question, solution = row.get("question"), row.get("answer")
    if not isinstance(question, str) or not question.strip():
        return None, "missing_question"
    if not isinstance(solution, str) or not solution.strip():
        return None, "missing_answer"
    if "####" not in solution:
        return None, "no_answer_line"
    answer = extract_gsm8k_answer(solution)
    if not answer:
        return None, "empty_answer"
    if not _NUMBER.fullmatch(answer):
        return None, "non_numeric_answer"
    question = question.strip()
    if rules.prompt_length is not None and rules.max_prompt_tokens is not None:
        if rules.prompt_length(question) > rules.max_prompt_tokens:
            return None, "prompt_too_long"
    return Problem(question=question, solution=solution.strip(), answer=answer), None
