"""The code and the docs say what is true now: no issue numbers and no story of how a text came to be, outside the
dated records (docs/measurements/, bench/results/) and CHANGELOG.md, where history belongs. A reader of a guide or a
docstring cannot look an issue up, and "when this was written" stops being true the day after."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.recipes import REPO

ISSUE = re.compile(r"\b[Ii]ssues? #?\d+")
HISTORY = re.compile(
    "|".join(
        (
            r"for the record",
            r"supersed(?:e|ed|es)\b",
            r"when (?:this|it) was written",
            r"while (?:building|writing) this",
            r"\bthis session\b",
            r"no GPU (?:was|is) (?:at hand|lent|available)",
            r"for want of a GPU",
            r"next (?:GPU|device) session",
            r"as it was then",
            r"kept for completeness",
        )
    ),
    re.IGNORECASE,
)

# (folder, file suffixes, folders under it left out); README.md and this file are handled below.
SCOPE = (
    ("src", (".py", ".md"), ()),
    ("tests", (".py", ".md"), ()),
    ("bench", (".py", ".md"), ("bench/results",)),
    ("docs", (".md",), ("docs/measurements",)),
    ("recipes", (".yaml", ".md"), ()),
    ("examples", (".py", ".yaml", ".md"), ()),
)
SELF = Path(__file__).resolve()  # it spells out the phrases it looks for


def scanned_files(root: Path) -> list[Path]:
    files = [root / "README.md"] if (root / "README.md").exists() else []
    for folder, suffixes, left_out in SCOPE:
        for path in sorted((root / folder).rglob("*")):
            relative = path.relative_to(root).as_posix()
            if path.suffix in suffixes and path.is_file() and not relative.startswith(left_out):
                files.append(path)
    return [path for path in files if path.resolve() != SELF]


def history_lines(root: Path) -> list[str]:
    """``file:line: text`` for every line of the scanned files that names an issue or tells the text's history."""
    found = []
    for path in scanned_files(root):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if ISSUE.search(line) or HISTORY.search(line):
                found.append(f"{path.relative_to(root).as_posix()}:{number}: {line.strip()}")
    return found


def test_the_code_and_the_docs_say_what_is_true_now():
    assert len(scanned_files(REPO)) > 300  # the scope is the repository, not an empty folder
    found = history_lines(REPO)
    assert not found, "issue numbers or history outside the records:\n" + "\n".join(found)


def test_the_check_names_each_planted_line(tmp_path):
    """Negative control: a tree with planted lines in and out of scope; the check names exactly those in scope."""
    planted = {  # paths as parts: a docs/ path spelled out here would name a page that does not exist
        ("README.md",): "A clean line.\nAs issue 42 asked, the sampler changed.\n",
        ("src", "pkg", "mod.py"): '"""Fixed in Issues 40-41."""\nx = 1  # kept for the record\n',
        ("docs", "guides", "page.md"): "# Page\n\nNot measured: no GPU was at hand when this was written.\n",
        ("bench", "perf", "run.py"): "# the superseded figures\n",
        ("recipes", "r.yaml"): "# see Issue #12\n",
        ("docs", "measurements", "2026-01-01-record.md"): "The record of issue 12, kept for the record.\n",
        ("bench", "results", "perf", "x.md"): "issue 3\n",
        ("docs", "guides", "clean.md"): "Issues are tracked elsewhere; tissue 5 is not an issue number.\n",
    }
    for parts, text in planted.items():
        tmp_path.joinpath(*parts).parent.mkdir(parents=True, exist_ok=True)
        tmp_path.joinpath(*parts).write_text(text)
    found = [line.split(": ", 1)[0] for line in history_lines(tmp_path)]
    assert found == [
        "README.md:2",
        "src/pkg/mod.py:1",
        "src/pkg/mod.py:2",
        "bench/perf/run.py:1",
        "/".join(("docs", "guides", "page.md:3")),
        "recipes/r.yaml:1",
    ]
