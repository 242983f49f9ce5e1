"""The unit tests mirror src/dtppo by module: a reader looking for a module's tests opens one name.

Every module ``src/dtppo/<folders>/<module>.py`` (``__init__`` and ``__main__`` aside) has a unit test
``tests/unit/<folders>/test_<module>.py`` or ``test_<module>_<aspect>.py`` (a root module ``src/dtppo/<module>.py``:
``tests/unit/test_<module>*.py``), or is in ``NO_UNIT_TEST``, the one table of modules whose behaviour needs what a unit
test does not have (ranks, a model run, a process of its own), each with the test that covers it and why. Every unit
test file names a module by that rule (a name matches the longest module it can: ``test_decoder_weights.py`` is
``decoder_weights``'s, not ``decoder``'s), and the table cannot rot: an entry for a module that has a unit test, for a
module that does not exist, or naming a test file that does not exist fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.support.recipes import REPO

SRC, UNIT = REPO / "src" / "dtppo", REPO / "tests" / "unit"

# module (its path under src/dtppo, without .py) -> (the test file that covers it, why it has no unit test)
NO_UNIT_TEST: dict[str, tuple[str, str]] = {
    "distributed/bridge": (
        "tests/functional/test_async.py",
        "the trainer-to-generation-ranks channel: two process groups and a TCP store",
    ),
    "distributed/comm": (
        "tests/distributed/test_aggregation_ranks.py",
        "collectives; in one process each is the identity",
    ),
    "distributed/parallelize": (
        "tests/distributed/test_parity.py",
        "FSDP2 and tensor-parallel wrapping needs a device mesh of ranks",
    ),
    "distributed/ranks": (
        "tests/distributed/test_launch_stop.py",
        "spawns the ranks and their process groups",
    ),
    "envs/worker": (
        "tests/unit/envs/test_client.py",
        "the loop of an environment process: the client's tests run it with env.num_workers >= 1",
    ),
    "launch/ray": ("tests/functional/test_ray.py", "needs a Ray cluster"),
    "ppo/entry": ("tests/functional/test_ppo_cli.py", "a PPO rank's whole run: `dtppo ppo` end to end"),
    "ppo/trainer": ("tests/functional/test_ppo_cli.py", "the PPO loop over a model run: `dtppo ppo` end to end"),
    "rewards/pool_worker": (
        "tests/unit/rewards/test_scoring.py",
        "the loop of a scoring process: the scorer's tests run it in its pool",
    ),
    "testing/workers": (
        "tests/distributed/test_parity.py",
        "fresh workers through one PPO round, in one process and on gloo ranks: model runs on ranks",
    ),
    "workers/base": (
        "tests/unit/workers/test_policy_episodes.py",
        "the workers' shared base over a built model: its policy and value workers' tests drive it",
    ),
}


@dataclass(frozen=True)
class Mirror:
    """What breaks the rule: modules without a unit test and not in the table, unit tests named for no module,
    table entries that have rotted (each with its reason)."""

    missing: list[str]
    orphans: list[str]
    stale: list[str]


def src_modules(src: Path = SRC) -> list[str]:
    """src's modules as paths under it without .py (``ppo/sample_filters``, ``cli``), packages' files aside."""
    return sorted(
        str(path.relative_to(src).with_suffix(""))
        for path in src.rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    )


def unit_test_files(unit: Path = UNIT) -> list[str]:
    """The unit tests as paths under ``unit`` without .py (``ppo/test_sample_filters``)."""
    return sorted(str(path.relative_to(unit).with_suffix("")) for path in unit.rglob("test_*.py"))


def module_of(test: str, modules: list[str]) -> str | None:
    """The module a unit test is named for: ``<folders>/test_<module>`` or ``<folders>/test_<module>_<aspect>``, the
    longest such module of the same folders; None for a name that fits none."""
    folder, _, name = test.rpartition("/")
    stem = name.removeprefix("test_")
    fits = [
        module
        for module in modules
        if module.rpartition("/")[0] == folder
        and (stem == module.rpartition("/")[2] or stem.startswith(module.rpartition("/")[2] + "_"))
    ]
    return max(fits, key=len, default=None)


def mirror(src: Path, unit: Path, table: dict[str, tuple[str, str]], repo: Path) -> Mirror:
    """How the tree under ``unit`` mirrors the modules under ``src``, with ``table`` the exemptions (their test files
    relative to ``repo``)."""
    modules = src_modules(src)
    tests = {test: module_of(test, modules) for test in unit_test_files(unit)}
    tested = set(tests.values())
    stale = []
    for module, (where, why) in sorted(table.items()):
        if module not in modules:
            stale.append(f"{module}: no such module")
        elif module in tested:
            stale.append(f"{module}: has a unit test")
        if not (repo / where).is_file():
            stale.append(f"{module}: {where} does not exist")
        if not why.strip():
            stale.append(f"{module}: no reason given")
    return Mirror(
        missing=[m for m in modules if m not in tested and m not in table],
        orphans=[t for t, module in tests.items() if module is None],
        stale=stale,
    )


def test_every_module_has_a_unit_test_named_for_it_or_an_entry_in_the_table():
    missing = mirror(SRC, UNIT, NO_UNIT_TEST, REPO).missing
    assert not missing, (
        "modules with no tests/unit/<folders>/test_<module>[_<aspect>].py and no entry in NO_UNIT_TEST:\n"
        + "\n".join(missing)
    )


def test_every_unit_test_is_named_for_a_module():
    orphans = mirror(SRC, UNIT, NO_UNIT_TEST, REPO).orphans
    assert not orphans, "unit tests named for no module of the same folders (tests/unit/...):\n" + "\n".join(orphans)


def test_the_table_names_only_modules_without_a_unit_test_and_tests_that_exist():
    stale = mirror(SRC, UNIT, NO_UNIT_TEST, REPO).stale
    assert not stale, "NO_UNIT_TEST entries that rotted:\n" + "\n".join(stale)


def test_a_unit_test_is_named_for_the_longest_module_it_fits():
    modules = ["cli", "generation/decoder", "generation/decoder_weights", "rewards/verifiers/math"]
    assert module_of("generation/test_decoder_weights", modules) == "generation/decoder_weights"
    assert module_of("generation/test_decoder_families", modules) == "generation/decoder"
    assert module_of("rewards/verifiers/test_math", modules) == "rewards/verifiers/math"
    assert module_of("test_cli_errors", modules) == "cli"
    assert module_of("rewards/test_math", modules) is None  # another folder
    assert module_of("test_client", modules) is None  # a prefix of the name, not the module and an aspect


def _plant(root: Path, files: list[str]) -> None:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")


def test_a_missing_test_an_orphan_and_stale_entries_are_each_reported(tmp_path):
    """Negative control on a planted tree: ``ops`` lacks a test; ``test_gone.py`` names no module; the table lists
    ``files`` (tested), ``nowhere`` (no such module) and ``ranks`` with a test file that does not exist, while its
    entry for ``data/hub`` is sound and the packages' own files need nothing."""
    src, unit = tmp_path / "src" / "pkg", tmp_path / "tests" / "unit"
    _plant(src, ["__init__.py", "__main__.py", "ops.py", "files.py", "ranks.py", "data/__init__.py", "data/hub.py"])
    _plant(src, ["data/rows.py"])
    _plant(unit, ["__init__.py", "test_files.py", "data/test_rows_bad.py", "data/test_gone.py", "conftest.py"])
    _plant(tmp_path, ["tests/distributed/test_hub.py"])
    table = {
        "files": ("tests/distributed/test_hub.py", "needs ranks"),
        "nowhere": ("tests/distributed/test_hub.py", "needs ranks"),
        "ranks": ("tests/distributed/test_ranks.py", "needs ranks"),
        "data/hub": ("tests/distributed/test_hub.py", "needs the network"),
    }
    found = mirror(src, unit, table, tmp_path)
    assert found.missing == ["ops"]
    assert found.orphans == ["data/test_gone"]
    assert found.stale == [
        "files: has a unit test",
        "nowhere: no such module",
        "ranks: tests/distributed/test_ranks.py does not exist",
    ]
    # and the same tree with the three faults mended reports nothing
    _plant(unit, ["test_ops_masks.py"])
    (unit / "data" / "test_gone.py").unlink()
    mended = {k: v for k, v in table.items() if k == "data/hub"} | {"ranks": ("tests/distributed/test_hub.py", "x")}
    assert mirror(src, unit, mended, tmp_path) == Mirror([], [], [])
