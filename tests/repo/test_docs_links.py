"""Every way to a page still leads to it: each relative link of the Markdown pages resolves, and each path under docs/
that the code, the tests, the recipes or a page names exists. A moved page fails here until every mention follows it
(CHANGELOG.md keeps the paths of its day; bench/results records are left as they were written)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.recipes import REPO

LINK = re.compile(r"\]\(([^)\s]+)\)")
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w./-]*\.(?:md|png)\b")
SCOPE = (  # (folder, suffixes); README.md too
    ("docs", (".md",)),
    ("src", (".py", ".md")),
    ("tests", (".py", ".md")),
    ("bench", (".py", ".md", ".sh")),
    ("recipes", (".yaml",)),
    ("examples", (".py", ".yaml")),
)
SELF = Path(__file__).resolve()  # its negative control spells out paths that do not exist


def _files(root: Path) -> list[Path]:
    files = [root / name for name in ("README.md", "Makefile", "pyproject.toml") if (root / name).exists()]
    for folder, suffixes in SCOPE:
        files += [
            path
            for path in sorted((root / folder).rglob("*"))
            if path.suffix in suffixes and path.is_file() and "results" not in path.relative_to(root).parts
        ]
    return [path for path in files if path.resolve() != SELF]


def broken(root: Path) -> list[str]:
    """``file:line: target`` for each relative link of a Markdown file that does not resolve, and each docs/ path
    named anywhere in scope that does not exist."""
    found = []
    for path in _files(root):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            where = f"{path.relative_to(root).as_posix()}:{number}"
            if path.suffix == ".md":
                for target in LINK.findall(line):
                    target = target.split("#", 1)[0]
                    if target and "://" not in target and not target.startswith("mailto:"):
                        if not (path.parent / target).exists():
                            found.append(f"{where}: link {target}")
            found += [f"{where}: {name}" for name in DOCS_PATH.findall(line) if not (root / name).exists()]
    return found


def test_every_link_and_docs_path_resolves():
    found = broken(REPO)
    assert not found, "links or docs/ paths to nothing:\n" + "\n".join(found)


def test_the_check_names_each_path_to_nothing(tmp_path):
    """Negative control: a moved page leaves a link and a mention behind, and both are named; the page's new path, a
    link to an anchor, a web link and an image that exists are not."""
    pages = {
        "docs/guides/usage.md": "See [metrics](metrics.md#reward) and [the web](https://example.org).\n",
        "docs/guides/metrics.md": "![curve](../img/a.png) [old](../usage.md)\n",
        "docs/img/a.png": "",
        "src/m.py": '"""As docs/guides/usage.md says; docs/usage.md moved."""\n',
        "README.md": "[usage](docs/guides/usage.md)\n",
    }
    for name, text in pages.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert broken(tmp_path) == ["docs/guides/metrics.md:1: link ../usage.md", "src/m.py:1: docs/usage.md"]
