"""GSM8K jsonl loader: ``{"question", "answer"}`` rows, final answer after ``####``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from dtppo.data.problem import Problem
from dtppo.rewards.math import extract_gsm8k_answer

log = logging.getLogger(__name__)


def load_gsm8k(path: str | Path, limit: int | None = None) -> list[Problem]:
    """Read a GSM8K jsonl file. Rows without a question or a numeric ``####`` answer are skipped and counted."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GSM8K file not found: {path}")
    problems: list[Problem] = []
    skipped = 0
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            problem = _parse_row(line)
            if problem is None:
                skipped += 1
                continue
            problems.append(problem)
            if limit is not None and len(problems) == limit:
                break
    if skipped:
        log.warning("%s: skipped %d malformed rows", path, skipped)
    if not problems:
        raise ValueError(f"{path}: no usable rows")
    return problems


def _parse_row(line: str) -> Problem | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(row, dict):
        return None
    question, solution = row.get("question"), row.get("answer")
    if not isinstance(question, str) or not isinstance(solution, str) or "####" not in solution:
        return None
    answer = extract_gsm8k_answer(solution)
    if not answer or not _is_number(answer):
        return None
    return Problem(question=question.strip(), solution=solution.strip(), answer=answer)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
