"""The layers of dtppo, as code: the root holds only the modules everything shares (``ROOT``), every other module
lives in a folder, and a unit (a folder or a root module) imports only units on earlier rows of ``ORDER``
(module-level and function-level imports, read from the source). docs/design/architecture.md's "Where code goes"
has one paragraph per row. Also: ``dtppo.config`` imports only the standard library and PyYAML, and loading a recipe
imports neither torch nor transformers."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.recipes import REPO

SRC = REPO / "src" / "dtppo"


@dataclass(frozen=True)
class Edge:
    """``importer`` (a module, e.g. dtppo.data.formats) imports ``imported`` at ``line`` of its file."""

    importer: str
    imported: str
    line: int


def _modules() -> dict[str, Path]:
    """Every module of dtppo by its dotted name (a package by its own name: dtppo.config for config/__init__.py)."""
    modules = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool) -> Iterator[str]:
    """The modules an import statement names: ``from a import b`` imports a, and a.b where b is a module."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        anchor = importer.split(".")[: len(importer.split(".")) - node.level + is_package]
        base = ".".join(anchor + ([node.module] if node.module else []))
    for alias in node.names:
        yield f"{base}.{alias.name}"
        yield base


def import_edges() -> list[Edge]:
    """Every import of a dtppo module, anywhere in a file (functions and ``if`` blocks included), of a module of
    dtppo or of an outside package (its top-level name)."""
    modules, edges = _modules(), []
    for importer, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in dict.fromkeys(_resolve(n, modules) for n in _imported(node, importer, is_package)):
                if name is not None:
                    edges.append(Edge(importer, name, node.lineno))
    return edges


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """A dtppo module's name, an outside package's top-level name, or None for ``from m import attribute``'s
    attribute (not a module)."""
    if name.split(".")[0] != "dtppo":
        return name.split(".")[0]
    return name if name in modules else None


# The root modules: the CLI, and what every layer shares (typed batches, masked ops, the errors, the test hooks,
# the atomic writes).
ROOT = {"cli", "types", "ops", "errors", "faults", "files"}
# A unit imports only units on earlier rows (a row's units never import each other).
ORDER = [
    {"config", "distributed", "types", "ops", "faults", "files"},
    {"errors"},  # re-exports config's ConfigError beside the run-stopping errors
    {"algorithms", "data", "usercode"},
    {"models", "envs", "observability"},
    {"generation", "rewards", "checkpoint"},
    {"workers", "launch"},
    {"ppo", "sft"},
    {"api"},
    {"cli", "dtppo"},  # dtppo: the package itself, whose names (PPOTrainer, load_config) are api's, loaded on use
    {"testing"},  # what the tests and bench/ share: it may import any unit, no unit imports it
]


def node_of(module: str) -> str:
    """The layering unit of a dtppo module: its folder (dtppo.config.schema -> config) or, for a root module, the
    module itself (dtppo.cli -> cli); outside packages are their own units."""
    parts = module.split(".")
    return parts[1] if parts[0] == "dtppo" and len(parts) > 1 else parts[0]


def package_graph(edges: list[Edge]) -> dict[str, dict[str, list[Edge]]]:
    """unit -> unit it imports -> the imports that make that edge (dtppo units only, no self-edges; the package
    itself, ``dtppo/__init__.py``, is the unit ``dtppo``: what ``from dtppo import ...`` gives)."""
    graph: dict[str, dict[str, list[Edge]]] = {}
    for edge in edges:
        if not edge.imported.startswith("dtppo.") or node_of(edge.importer) == "__main__":
            continue
        source, target = node_of(edge.importer), node_of(edge.imported)
        graph.setdefault(source, {})
        if source != target:
            graph[source].setdefault(target, []).append(edge)
    return graph


def root_modules(src: Path) -> set[str]:
    """The modules at the package's root, besides ``__init__`` and ``__main__``."""
    return {p.stem for p in src.glob("*.py")} - {"__init__", "__main__"}


def order_violations(graph: dict[str, dict[str, list[Edge]]], order: list[set[str]]) -> list[str]:
    """Each unit on no row of ``order``, and each import of a unit on the same or a later row, named with the
    imports that make it."""
    row = {unit: i for i, units in enumerate(order) for unit in units}
    found = [f"{unit} is on no row of ORDER" for unit in sorted(graph) if unit not in row]
    for source in sorted(graph):
        for target, imports in sorted(graph[source].items()):
            if source in row and target in row and row[target] >= row[source]:
                lines = ", ".join(f"{e.importer} line {e.line} imports {e.imported}" for e in imports)
                found.append(f"{source} (row {row[source]}) -> {target} (row {row[target]}): {lines}")
    return found


def test_loading_a_recipe_imports_neither_torch_nor_transformers():
    code = (
        "import sys, dtppo.config; dtppo.config.load('recipes/tiny-math-cpu.yaml'); "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_config_imports_only_config_the_standard_library_and_yaml():
    outside = [
        f"{e.importer} line {e.line} imports {e.imported}"
        for e in import_edges()
        if node_of(e.importer) == "config"
        and node_of(e.imported) != "config"
        and e.imported not in sys.stdlib_module_names
        and e.imported != "yaml"
    ]
    assert outside == []


def test_the_root_holds_only_the_shared_modules():
    assert root_modules(SRC) == ROOT


def test_every_unit_imports_only_earlier_rows():
    graph = package_graph(import_edges())
    assert order_violations(graph, ORDER) == []
    # the walk sees the layers at all: a graph that lost its edges would pass the line above
    assert {"workers", "generation", "algorithms", "rewards"} <= set(graph["ppo"])
    assert set().union(*ORDER) == set(graph) | {"config", "distributed", "types", "ops", "errors", "faults", "files"}


def test_the_order_check_fails_on_a_planted_upward_import_and_an_unplaced_unit():
    # negative control: data (row 1) importing workers (row 4), a row-0 unit importing its row-mate, a new unit
    edge = Edge("dtppo.data.loader", "dtppo.workers.layout", 7)
    graph = {"data": {"workers": [edge]}, "types": {"ops": [edge]}, "helpers": {}, "workers": {}, "ops": {}}
    assert order_violations(graph, ORDER) == [
        "helpers is on no row of ORDER",
        "data (row 2) -> workers (row 5): dtppo.data.loader line 7 imports dtppo.workers.layout",
        "types (row 0) -> ops (row 0): dtppo.data.loader line 7 imports dtppo.workers.layout",
    ]


def test_a_new_root_module_is_seen(tmp_path):
    # negative control: a root module beside the shared ones breaks the allow-list
    for name in [*ROOT, "__init__", "__main__", "helpers"]:
        (tmp_path / f"{name}.py").write_text("")
    assert root_modules(tmp_path) - ROOT == {"helpers"}
