"""The two maps a newcomer starts from cannot drift from the code: docs/design/architecture.md's layout block names
every module of src/dtppo, and every name in its data-flow table resolves (a module, a class or function and its
attribute, or a config key)."""

import importlib
import pkgutil
import re

import pytest

import dtppo
from dtppo.config import Config
from tests.support.recipes import REPO

SRC = REPO / "src" / "dtppo"


def _layout_entries() -> tuple[dict[str, str], str]:
    """docs/design/architecture.md's layout block: each package entry's text by its key (``rollout/``), and the
    top-level entries' text."""
    design = (REPO / "docs" / "design" / "architecture.md").read_text()
    block = re.search(r"```\nsrc/dtppo/\n(.*?)```", design, re.S).group(1)
    packages, top, key = {}, [], None
    for line in block.splitlines():
        if re.match(r"  \S", line):  # a new entry
            key = line.split()[0] if line.split()[0].endswith("/") else None
        if key is not None:
            packages[key] = packages.get(key, "") + line + "\n"
        else:
            top.append(line)
    return packages, "\n".join(top)


def _modules() -> list[str]:
    """src/dtppo's modules as paths relative to the package (``rollout/generator.py``), without the package files."""
    return sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if p.name not in ("__init__.py", "__main__.py"))


def _named(module: str, packages: dict[str, str], top: str) -> bool:
    parts = module.split("/")
    if len(parts) == 1:
        return re.search(rf"(?<![\w/]){re.escape(parts[0])}\b", top) is not None
    text = packages.get(parts[0] + "/", "")
    return all(re.search(rf"(?<![\w]){re.escape(p if p.endswith('.py') else p + '/')}", text) for p in parts[1:])


def test_the_design_doc_layout_names_every_module():
    packages, top = _layout_entries()
    missing = [m for m in _modules() if not _named(m, packages, top)]
    assert not missing, f"docs/design/architecture.md's layout block does not name: {missing}"


def test_the_layout_check_fails_on_a_module_left_out():
    """Negative control: a block without generation/decoder.py, or without the root's errors.py, is caught."""
    packages, top = _layout_entries()
    packages = packages | {"generation/": packages["generation/"].replace("decoder.py", "")}
    assert not _named("generation/decoder.py", packages, top)
    assert not _named("errors.py", packages, top.replace("errors.py", ""))


def _every_module() -> list[object]:
    names = [m.name for m in pkgutil.walk_packages(dtppo.__path__, "dtppo.") if not m.name.endswith("__main__")]
    return [importlib.import_module(name) for name in names]


def _resolves(name: str, modules: list[object]) -> bool:
    """``name``: ``package.module[.attr...]`` under dtppo, ``Class.attr`` / ``function`` defined in some dtppo
    module, or a dotted config key (``ppo.gae.gamma``)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):  # the longest prefix that is a dtppo module
        try:
            obj = importlib.import_module("dtppo." + ".".join(parts[:cut]))
        except ImportError:
            continue
        if _attrs(obj, parts[cut:]):
            return True
        break  # not in that module: maybe a config key of the same section name (ppo/ and ppo.gae.gamma)
    if any(_attrs(m, parts) for m in modules):
        return True
    node = Config()
    for part in parts:
        if not hasattr(node, part):
            return False
        node = getattr(node, part)
    return True


def _attrs(obj: object, names: list[str]) -> bool:
    for name in names:
        if not hasattr(obj, name):
            return False
        obj = getattr(obj, name)
    return True


def _data_flow_names() -> list[str]:
    design = (REPO / "docs" / "design" / "architecture.md").read_text()
    table = design.split("## Data flow", 1)[1].split("\n## ", 1)[0]
    code_column = [row.split("|")[2] for row in table.splitlines() if row.startswith("| ") and "---" not in row]
    names = [n for cell in code_column[1:] for n in re.findall(r"`([^`]+)`", cell)]
    return [n for n in names if re.fullmatch(r"[A-Za-z_][\w.]*", n)]


def test_every_name_in_the_data_flow_table_resolves():
    names = _data_flow_names()
    assert len(names) >= 20
    modules = _every_module()
    unresolved = [n for n in names if not _resolves(n, modules)]
    assert not unresolved, f"docs/design/architecture.md's data-flow table names what the code lacks: {unresolved}"


@pytest.mark.parametrize("name", ["rewards.scoring.score_responses", "PolicyWorker.rollout_model", "ppo.gammma"])
def test_a_stale_name_does_not_resolve(name):
    assert not _resolves(name, _every_module())
