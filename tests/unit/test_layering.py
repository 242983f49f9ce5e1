"""The package layering: ``dtppo.config`` is a leaf (standard library and PyYAML), loading a recipe imports neither
torch nor transformers, and no two packages of dtppo import each other (module-level and function-level imports,
read from the source)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
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


def node_of(module: str) -> str:
    """The layering unit of a dtppo module: its subpackage (dtppo.config.schema -> config) or, for a top-level
    module, the module itself (dtppo.trainer -> trainer); outside packages are their own units."""
    parts = module.split(".")
    return parts[1] if parts[0] == "dtppo" and len(parts) > 1 else parts[0]


def package_graph(edges: list[Edge]) -> dict[str, dict[str, list[Edge]]]:
    """node -> node it imports -> the imports that make that edge (dtppo nodes only, no self-edges)."""
    graph: dict[str, dict[str, list[Edge]]] = {}
    for edge in edges:
        if not edge.imported.startswith("dtppo"):
            continue
        source, target = node_of(edge.importer), node_of(edge.imported)
        graph.setdefault(source, {})
        if source != target:
            graph[source].setdefault(target, []).append(edge)
    return graph


def strongly_connected(graph: dict[str, dict[str, list]]) -> list[list[str]]:
    """Tarjan's strongly connected components, each sorted, in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, {})):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def reachable(graph: dict[str, dict[str, list]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph.get(todo.pop(), {}):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def describe_cycle(graph: dict[str, dict[str, list[Edge]]], component: list[str]) -> str:
    """The component's nodes, then a shortest cycle through its first node, each step with the imports that make
    it."""
    start, members = component[0], set(component)
    parent: dict[str, str] = {}  # breadth first from start, inside the component, until start is reached again
    frontier = [start]
    while start not in parent:
        reached = []
        for node in frontier:
            for target in sorted(set(graph[node]) & members - parent.keys()):
                parent[target] = node
                reached.append(target)
        frontier = reached
    path = [start, parent[start]]
    while path[-1] != start:
        path.append(parent[path[-1]])
    path.reverse()
    steps = []
    for source, target in zip(path, path[1:]):
        imports = ", ".join(f"{e.importer} line {e.line} imports {e.imported}" for e in graph[source][target])
        steps.append(f"{source} -> {target} ({imports})")
    return f"{', '.join(component)}: " + "; ".join(steps)


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


def test_the_packages_are_layered():
    graph = package_graph(import_edges())
    assert reachable(graph, "config") & {"data", "models", "rewards"} == set()
    assert reachable(graph, "algorithms") & {"workers", "trainer", "rollout"} == set()
    # The placement rules of docs/design.md ("Where code goes").
    assert reachable(graph, "rollout") & {"workers", "trainer", "orchestration", "rewards"} == set()
    assert "rewards" not in reachable(graph, "data") and reachable(graph, "answers") == set()
    assert reachable(graph, "distributed") == set()
    assert "orchestration" not in reachable(graph, "workers")
    # the walk sees the layers at all: a graph that lost its edges would pass the two lines above
    assert "config" in reachable(graph, "data") and {"workers", "rollout", "algorithms"} <= reachable(graph, "trainer")


def test_no_two_packages_import_each_other():
    graph = package_graph(import_edges())
    cycles = [describe_cycle(graph, c) for c in strongly_connected(graph) if len(c) > 1]
    assert cycles == [], "package cycles:\n" + "\n".join(cycles)


def test_the_cycle_finder_finds_a_planted_cycle():
    # negative control: a -> b -> c -> a is one component; d, which only imports a, stays apart
    edge = Edge("x", "y", 1)
    graph = {"a": {"b": [edge]}, "b": {"c": [edge]}, "c": {"a": [edge]}, "d": {"a": [edge]}}
    assert sorted(strongly_connected(graph)) == [["a", "b", "c"], ["d"]]
    assert describe_cycle(graph, ["a", "b", "c"]) == (
        "a, b, c: a -> b (x line 1 imports y); b -> c (x line 1 imports y); c -> a (x line 1 imports y)"
    )
    assert sorted(strongly_connected({"a": {"b": [edge]}, "b": {}})) == [["a"], ["b"]]
