"""Prompt rows from a jsonl file or any row source, read in a task's format (``data.formats``).

A bad row can never reach a training step: it is counted by reason and skipped (``on_bad_row="skip"``, the
default), or refused with a ``DataError`` naming the file and line, or the dataset row (``"error"``). Bad rows
are: not JSON, not an object, a missing or empty prompt (``missing_<prompt column>``) or one that is neither
text nor a list of chat messages (``bad_messages``), a missing reference (``missing_<reference column>``) or
one the format cannot read (e.g. GSM8K's ``no_answer_line``), and a prompt longer than ``max_prompt_tokens``.
"""

from __future__ import annotations

import collections
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dtppo.data.problem import Messages, Problem, Prompt
from dtppo.errors import InputError

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")


class DataError(InputError, ValueError):
    """A data source is unusable; the message names the file or dataset (and the row, for a bad row)."""


@dataclass(frozen=True)
class RowFormat:
    """How a task reads a row.

    name: the format's name in messages ("GSM8K"). prompt_key: the prompt column. answer_key: the column the
    reference comes from (None: no reference). reference: that column's value -> (reference, None), or (None, the
    bad-row reason). solution_key: the column of worked solutions SFT trains on (None: none). preset: GSM8K or MATH,
    whose derived reference replaces a column named ``answer`` (GSM8K's holds the worked solution); a custom
    format refuses such a column beside its reference column instead."""

    name: str
    prompt_key: str
    answer_key: str | None
    reference: Callable[[Any], tuple[Any, str | None]]
    solution_key: str | None = None
    preset: bool = True


@dataclass(frozen=True)
class RowRules:
    """What makes a row bad beyond its format, and what to do with one.

    prompt_length: tokens of a prompt's formatted text (as the trainer encodes it); None = unchecked."""

    on_bad_row: Literal["skip", "error"] = "skip"
    max_prompt_tokens: int | None = None
    prompt_length: Callable[[Prompt], int] | None = None


def read_jsonl(
    path: str | Path, fmt: RowFormat, limit: int | None = None, rules: RowRules = RowRules()
) -> tuple[list[Problem], collections.Counter]:
    """(usable problems, bad-row count per reason) of a jsonl file (the first ``limit`` usable ones). Blank lines
    are not rows. Raises FileNotFoundError for a missing file, DataError for a bad row under
    ``on_bad_row="error"`` or a file without one usable row."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{fmt.name} file not found: {path}")
    with path.open(encoding="utf-8", errors="replace") as fh:
        rows = ((f"{path}:{lineno}", _decode(line)) for lineno, line in enumerate(fh, start=1) if line.strip())
        return collect_rows(rows, str(path), fmt, limit, rules)


def collect_rows(
    rows: Iterable[tuple[str, Any]], source: str, fmt: RowFormat, limit: int | None, rules: RowRules
) -> tuple[list[Problem], collections.Counter]:
    """(usable problems, bad-row count per reason) of ``(where, row)`` pairs: ``where`` locates a row in its
    source for the error message (``file:line``), ``row`` is its decoded value (``INVALID_JSON`` if none)."""
    problems: list[Problem] = []
    bad: collections.Counter = collections.Counter()
    first_columns = None
    for where, row in rows:
        if first_columns is None and isinstance(row, dict):
            first_columns = sorted(row)
            _check_answer_column(where, row, fmt)
        problem, reason = parse_row(row, fmt, rules)
        if reason is not None:
            if rules.on_bad_row == "error":
                raise DataError(
                    f"{where}: bad {fmt.name} row ({reason}); fix it, or set data.on_bad_row=skip to skip such rows"
                )
            bad[reason] += 1
            continue
        problems.append(problem)
        if limit is not None and len(problems) == limit:
            break
    reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(bad.items()))
    if not problems:
        needed = [k for k in (fmt.prompt_key, fmt.answer_key) if k is not None]
        lacking = first_columns is not None and any(k not in first_columns for k in needed)
        hint = f"; the first row's columns are {first_columns}" if lacking else ""
        raise DataError(f"{source}: no usable rows ({sum(bad.values())} bad{': ' if bad else ''}{reasons}){hint}")
    if bad:
        log.warning("%s: skipped %d bad rows (%s)", source, sum(bad.values()), reasons)
    return problems, bad


def _check_answer_column(where: str, row: dict, fmt: RowFormat) -> None:
    """Reward functions get the reference as ``answer=``: a different column of that name would be hidden."""
    if not fmt.preset and fmt.answer_key not in (None, "answer") and "answer" in row:
        raise DataError(
            f"{where}: the rows have a column 'answer' besides the reference column "
            f"{fmt.answer_key!r} (data.answer_key): reward functions get the reference as answer=, "
            f"so rename that column"
        )


INVALID_JSON = object()  # the decoded value of a line that is not JSON


def _decode(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return INVALID_JSON


def parse_row(row: Any, fmt: RowFormat, rules: RowRules) -> tuple[Problem | None, str | None]:
    """(problem, None) for a good row, (None, reason) for a bad one."""
    if row is INVALID_JSON:
        return None, "invalid_json"
    if not isinstance(row, dict):
        return None, "not_an_object"
    prompt, reason = _prompt(row.get(fmt.prompt_key), fmt.prompt_key)
    if reason is not None:
        return None, reason
    reference = None
    if fmt.answer_key is not None:
        value = row.get(fmt.answer_key)
        if value is None or (isinstance(value, str) and not value.strip()):
            return None, f"missing_{fmt.answer_key}"
        reference, reason = fmt.reference(value)
        if reason is not None:
            return None, reason
    if rules.prompt_length is not None and rules.max_prompt_tokens is not None:
        if rules.prompt_length(prompt) > rules.max_prompt_tokens:
            return None, "prompt_too_long"
    solution = row.get(fmt.solution_key) if fmt.solution_key else None
    if isinstance(solution, (int, float)) and not isinstance(solution, bool):
        solution = str(solution)  # a custom task's numeric reference: its text is the target
    return Problem(
        question=prompt,
        solution=solution.strip() if isinstance(solution, str) else "",
        answer=reference,
        columns={k: v for k, v in row.items() if k != fmt.prompt_key},
    ), None


def _prompt(value: Any, key: str) -> tuple[Prompt | None, str | None]:
    """A prompt: non-empty text (stripped), or a non-empty list of ``{"role", "content"}`` messages."""
    if isinstance(value, str):
        return (value.strip(), None) if value.strip() else (None, f"missing_{key}")
    if isinstance(value, list):
        return _messages(value)
    return None, f"missing_{key}"


def _messages(value: list) -> tuple[Messages | None, str | None]:
    ok = bool(value) and all(
        isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str) for m in value
    )
    if not ok or value[-1]["role"] == "assistant":
        return None, "bad_messages"
    return [{"role": m["role"], "content": m["content"]} for m in value], None
