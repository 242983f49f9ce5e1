"""The two tiers' contract (docs/guides/testing.md): every module of src/dtppo keeps a test in `make test`.

A module is covered when a test file of the default tier (one with a test not marked slow) imports it, or, for
the modules that no test imports because they run inside what a test drives (the CLI's launcher, the scoring
processes, the config loader behind ``config.load``), when the test file ``COVERED_THROUGH`` names for it is in the
default tier and imports what drives it.
"""

from __future__ import annotations

import ast

from tests.support.recipes import REPO

SRC, TESTS = REPO / "src", REPO / "tests"

# module -> (the default-tier test file that exercises it, the module that test imports to drive it)
COVERED_THROUGH = {
    "dtppo.distributed.bridge": ("tests/unit/generation/test_remote.py", "dtppo.generation.remote"),
    "dtppo.envs.worker": ("tests/unit/envs/test_client.py", "dtppo.envs.client"),
    "dtppo.launch.model_checks": ("tests/unit/launch/test_model_checks.py", "dtppo.launch.preflight"),
    "dtppo.launch.ray": ("tests/functional/test_ray.py", "tests.support.cli"),
    "dtppo.ppo.entry": ("tests/functional/test_ppo_cli.py", "tests.support.cli"),
    "dtppo.rewards.pool_worker": ("tests/unit/usercode/test_pool_bounds.py", "dtppo.rewards.scoring"),
    "dtppo.usercode.pool": ("tests/unit/usercode/test_pool_bounds.py", "dtppo.rewards.scoring"),
    "dtppo.workers.base": ("tests/unit/workers/test_policy_dropout.py", "dtppo.workers.policy"),
    # what the tests and bench/ share, imported through tests/support/harness.py
    "dtppo.testing.workers": ("tests/distributed/test_parity.py", "tests.support.harness"),
}


def src_modules() -> list[str]:
    """Every module of src/dtppo but the packages' ``__init__`` and ``__main__``."""
    names = []
    for path in sorted((SRC / "dtppo").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] not in ("__init__", "__main__"):
            names.append(".".join(parts))
    return names


def _imports(tree: ast.Module) -> set[str]:
    """What a file imports: ``a.b`` for ``import a.b``; ``a.b`` and ``a.b.c`` for ``from a.b import c``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _marked_slow(node: ast.AST) -> bool:
    return "mark.slow" in ast.unparse(node)


def default_tier_imports(root=TESTS) -> dict[str, set[str]]:
    """Test file (relative to ``root``'s parent: the repository for tests/) -> what it imports, for the files with
    a test that `make test` runs."""
    files = {}
    for path in sorted(root.rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        whole_file_slow = any(
            isinstance(node, ast.Assign)
            and any(getattr(target, "id", None) == "pytestmark" for target in node.targets)
            and _marked_slow(node.value)
            for node in tree.body
        )
        tests = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
        if not whole_file_slow and any(not any(map(_marked_slow, t.decorator_list)) for t in tests):
            files[str(path.relative_to(root.parent))] = _imports(tree)
    return files


def uncovered(modules: list[str], files: dict[str, set[str]]) -> list[str]:
    """The modules with no default-tier test: none imports them, and ``COVERED_THROUGH``'s file for them is missing
    from the tier or does not import what drives them."""
    missing = []
    for module in modules:
        if any(module in imports for imports in files.values()):
            continue
        through = COVERED_THROUGH.get(module)
        if through is None or through[1] not in files.get(through[0], set()):
            missing.append(module)
    return missing


def test_every_src_module_keeps_a_test_in_make_test():
    assert uncovered(src_modules(), default_tier_imports()) == []


def test_the_map_names_only_modules_no_test_imports():
    """An entry of ``COVERED_THROUGH`` for a module a default-tier test imports directly is stale."""
    files = default_tier_imports()
    direct = {m for m in COVERED_THROUGH if any(m in imports for imports in files.values())}
    assert direct == set() and set(COVERED_THROUGH) <= set(src_modules())


def test_a_module_whose_only_test_is_slow_is_reported(tmp_path):
    """Negative control: a module whose only tests are slow is reported; one a default-tier file tests is not."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_only_slow.py").write_text(
        "import pytest\nfrom dtppo.ops import masked_sum\npytestmark = pytest.mark.slow\n\ndef test_a():\n    pass\n"
    )
    (tests / "test_one_slow.py").write_text(
        "import pytest\nimport dtppo.faults\n\n@pytest.mark.slow\ndef test_b():\n    pass\n"
    )
    (tests / "test_fast.py").write_text("from dtppo.types import Experience\n\ndef test_c():\n    pass\n")
    files = default_tier_imports(tests)
    assert uncovered(["dtppo.ops", "dtppo.faults", "dtppo.types"], files) == ["dtppo.ops", "dtppo.faults"]


def test_ci_runs_both_tiers_and_refuses_skips():
    """.ci/run: `make test`, then `make test-slow` (pytest -m slow), with DTPPO_REQUIRE_ALL=1 (tests/conftest.py)."""
    ci = (REPO / ".ci" / "run").read_text()
    assert "export DTPPO_REQUIRE_ALL=1" in ci
    assert ci.index("\nmake test\n") < ci.index("\nmake test-slow\n")
    makefile = (REPO / "Makefile").read_text()
    assert '-m "not slow"' in makefile.split("\ntest: ")[1].split("\n\n")[0]
    assert "-m slow" in makefile.split("\ntest-slow: ")[1].split("\n\n")[0]
