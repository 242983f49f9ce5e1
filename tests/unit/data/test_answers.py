"""dtppo.data.answers: the one box scanner, the ``####`` marker, the tail, and the import rule that keeps it a leaf (the
data layer reads reference answers with it, and imports nothing from the rewards)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dtppo
from dtppo.data.answers import TAIL_CHARS, after_hashes, extract_gsm8k_answer, last_boxed, tail

SRC = Path(dtppo.__file__).resolve().parent


@pytest.mark.parametrize(
    ("text", "body"),
    [
        ("\\boxed{42}", "42"),
        ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{\\left\\{1,\\{2\\}\\right\\}}", "\\left\\{1,\\{2\\}\\right\\}"),
        ("\\boxed{1} then \\boxed{2} and \\boxed{3}", "3"),
        ("\\boxed{{a}{b}}", "{a}{b}"),
        ("\\fbox{7}", "7"),
        ("\\boxed{1} \\fbox{2}", "2"),
        ("\\fbox{1} \\boxed{2}", "2"),
        ("\\boxed{}", ""),
        ("\\boxed{\\boxed{5}}", "5"),
        ("\\boxed{1} \\boxed{2", None),  # the last box is unclosed: no earlier box stands in
        ("\\boxed{{1}", None),
        ("no box here", None),
        ("\\boxed 5", None),
        ("", None),
        ("\\boxed{" + "1" * 600 + "}", None),  # the scan for the closing brace is bounded
        ("\\boxed{" * 10_000, None),
    ],
)
def test_last_boxed(text, body):
    assert last_boxed(text) == body


def test_the_box_scan_stops_at_max_body():
    assert last_boxed("\\boxed{" + "1" * 300 + "}") == "1" * 300
    assert last_boxed("\\boxed{" + "1" * 300 + "}", max_body=256) is None
    assert last_boxed("\\fbox{" + "1" * 256 + "}", max_body=256) is None  # the closing brace is the 257th
    assert last_boxed("\\fbox{" + "1" * 255 + "}", max_body=256) == "1" * 255


def test_after_hashes_is_everything_after_the_last_marker():
    assert after_hashes("#### 5\nwork\n#### 7\nmore") == " 7\nmore"
    assert after_hashes("####") == ""
    assert after_hashes("no marker") is None


def test_extract_gsm8k_answer():
    assert extract_gsm8k_answer("a\n#### 1,000 ") == "1000"
    assert extract_gsm8k_answer("#### 5\n#### -3") == "-3"
    with pytest.raises(ValueError):
        extract_gsm8k_answer("no answer line")


def test_tail_is_the_end_of_a_string_and_empty_otherwise():
    assert tail("x" * TAIL_CHARS + "end") == "x" * (TAIL_CHARS - 3) + "end"
    assert tail("short") == "short"
    assert tail(None) == "" and tail(42) == ""


def _dtppo_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    return {name for name in names if name == "dtppo" or name.startswith("dtppo.")}


def test_answers_is_a_leaf():
    # the data formats and the verifiers (in scoring processes) both read answers through it; that the data layer
    # never imports the rewards is the layer order's (tests/repo/test_layering.py)
    assert _dtppo_imports(SRC / "data" / "answers.py") == set()
