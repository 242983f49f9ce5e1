"""Modules below the workers receive their own config section, not the whole ``Config``: a data loader is given
``data``, a generator ``policy.generation``, a rewarder ``reward``. The trainer, the workers and the launcher (the rows
of the layering above ``generation``/``rewards``/``checkpoint``) hold the whole tree and hand each part its section."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.repo.test_layering import ORDER, SRC

BELOW_WORKERS = set().union(*ORDER[1:4])
# The one exception: export rebuilds a whole run (its models, its dtypes) from the Config a checkpoint saved.
WHOLE_CONFIG_ALLOWED = {"checkpoint/export.py"}


def takes_whole_config(source: str) -> list[int]:
    """Lines where ``source`` imports ``Config`` from dtppo.config or annotates something with it."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "dtppo.config":
            lines += [node.lineno for alias in node.names if alias.name == "Config"]
        elif isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            names = {n.id for n in ast.walk(node.annotation) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(node.annotation) if isinstance(n, ast.Attribute)}
            lines += [node.lineno] if "Config" in names else []
    return lines


def offenders(src: Path) -> list[str]:
    found = []
    for path in sorted(src.rglob("*.py")):
        relative = path.relative_to(src).as_posix()
        if relative.split("/")[0] not in BELOW_WORKERS or relative in WHOLE_CONFIG_ALLOWED:
            continue
        found += [f"{relative}:{line}" for line in takes_whole_config(path.read_text())]
    return found


def test_modules_below_the_workers_take_their_own_section():
    assert offenders(SRC) == [], "pass the section the module needs (cfg.data, cfg.policy.generation, ...)"


def test_the_check_sees_an_import_and_an_annotation(tmp_path):
    # negative control: a planted module that takes the whole tree is reported, one line per use
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "bad.py").write_text(
        "from dtppo.config import Config, DataConfig\n\n\ndef f(cfg: Config, data: DataConfig) -> None: ...\n"
    )
    (tmp_path / "ppo").mkdir()
    (tmp_path / "ppo" / "fine.py").write_text("from dtppo.config import Config\n")
    assert offenders(tmp_path) == ["data/bad.py:1", "data/bad.py:4"]
