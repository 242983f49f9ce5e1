"""Bad GSM8K rows are counted and skipped (data.on_bad_row: skip) or refused with file:line (error)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dtppo.data.formats import GSM8K
from dtppo.data.rows import DataError, RowRules, read_jsonl

LONG_QUESTION = "How many apples? " * 40  # 680 characters: over a 200-token limit with a character tokenizer

# (line written to the file, expected reason or None for a good row); blank lines are not rows.
ROWS = [
    (json.dumps({"question": "Tom has 2 apples and buys 3. How many?", "answer": "2 + 3 = 5\n#### 5"}), None),
    ("{broken json", "invalid_json"),
    (json.dumps(["question", "answer"]), "not_an_object"),
    (json.dumps("just a string"), "not_an_object"),
    ("", None),
    (json.dumps({"answer": "#### 4"}), "missing_question"),
    (json.dumps({"question": "   ", "answer": "#### 4"}), "missing_question"),
    (json.dumps({"question": 7, "answer": "#### 4"}), "missing_question"),
    (json.dumps({"question": "Q without answer"}), "missing_answer"),
    (json.dumps({"question": "Q", "answer": ""}), "missing_answer"),
    (json.dumps({"question": "Q", "answer": "no marker here"}), "no_answer_line"),
    (json.dumps({"question": "Q", "answer": "work\n####   "}), "empty_answer"),
    (json.dumps({"question": "Q", "answer": "#### twelve"}), "non_numeric_answer"),
    (json.dumps({"question": "Q", "answer": "#### nan"}), "non_numeric_answer"),
    (json.dumps({"question": "Q", "answer": "#### \u0664\u0662"}), "non_numeric_answer"),
    (json.dumps({"question": "Q", "answer": "#### 1e5"}), "non_numeric_answer"),
    (json.dumps({"question": LONG_QUESTION, "answer": "#### 1"}), "prompt_too_long"),
    (json.dumps({"question": "Anna has 10 pens and loses 4. How many?", "answer": "10 - 4 = 6\n#### 1,006"}), None),
    (json.dumps({"question": "A short one", "answer": "#### -3.5"}), None),
]
GOOD = [
    ("Tom has 2 apples and buys 3. How many?", "5"),
    ("Anna has 10 pens and loses 4. How many?", "1006"),
    ("A short one", "-3.5"),
]
FIRST_BAD_LINE = 2
RULES = RowRules(max_prompt_tokens=200, prompt_length=len)


@pytest.fixture
def data_file(tmp_path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(line for line, _ in ROWS) + "\n")
    return path


def _expected_counts() -> dict[str, int]:
    counts: dict[str, int] = {}
    for line, reason in ROWS:
        if reason is not None:
            counts[reason] = counts.get(reason, 0) + 1
    return counts


def test_skip_mode_counts_every_kind_and_keeps_only_good_rows(data_file):
    problems, bad = read_jsonl(data_file, GSM8K, rules=RULES)
    assert [(p.question, p.answer) for p in problems] == GOOD
    assert dict(bad) == _expected_counts()
    assert sum(bad.values()) == 15 and len(bad) == 8


def test_without_a_tokenizer_long_prompts_are_not_judged(data_file):
    problems, bad = read_jsonl(data_file, GSM8K)
    assert "prompt_too_long" not in bad and len(problems) == len(GOOD) + 1


def test_limit_counts_good_rows(data_file):
    assert [p.answer for p in read_jsonl(data_file, GSM8K, limit=2, rules=RULES)[0]] == ["5", "1006"]


def test_error_mode_names_the_file_and_the_line(data_file):
    with pytest.raises(DataError) as err:
        read_jsonl(data_file, GSM8K, rules=RowRules(on_bad_row="error"))
    assert str(err.value).startswith(f"{data_file}:{FIRST_BAD_LINE}: bad GSM8K row (invalid_json)")
    assert "data.on_bad_row=skip" in str(err.value)


def test_error_mode_line_numbers_count_blank_lines(tmp_path):
    path = tmp_path / "late.jsonl"
    path.write_text(ROWS[0][0] + "\n\n\n" + json.dumps({"question": "Q", "answer": "#### x"}) + "\n")
    with pytest.raises(DataError, match=rf"^{path}:4: bad GSM8K row \(non_numeric_answer\)"):
        read_jsonl(path, GSM8K, rules=RowRules(on_bad_row="error"))


def test_a_file_without_usable_rows_is_refused(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("{}\n[]\n")
    with pytest.raises(DataError, match="no usable rows"):
        read_jsonl(path, GSM8K)[0]
