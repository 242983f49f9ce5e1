"""bench/README.md's table is complete: it names every module of bench/perf/, bench/learning/ and bench/device/ (as
it runs), nothing that does not exist, and only make targets the Makefile has; each script a make target runs by its
folder is listed under that target."""

import re

from tests.support.recipes import REPO

BENCH = REPO / "bench"


def _rows(readme: str) -> dict[str, str]:
    """The table's rows: the module a row names (its first backticked name) -> its make-target cell."""
    rows = {}
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and (name := re.match(r"`(bench\.[\w.]+)`", cells[0])):
            rows[name.group(1)] = cells[2]
    return rows


def _scripts() -> set[str]:
    """Every module of bench/perf/, bench/learning/ and bench/device/ as it runs (a __main__ as its package)."""
    return {
        f"bench.{path.parent.name}" + ("" if path.stem == "__main__" else f".{path.stem}")
        for kind in ("perf", "learning", "device")
        for path in (BENCH / kind).glob("*.py")
        if path.name != "__init__.py"
    }


def test_the_table_names_every_script_and_no_other():
    rows = _rows((BENCH / "README.md").read_text())
    assert set(rows) == _scripts()


def test_the_make_targets_exist_and_run_what_the_table_says():
    rows = _rows((BENCH / "README.md").read_text())
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.MULTILINE))
    named = {t for cell in rows.values() for t in re.findall(r"`make ([\w-]+)`", cell)}
    assert named and named <= targets
    perf = re.findall(r"^BENCH_PERF \+?:?= (.*)$", makefile, re.MULTILINE)
    run_by_bench = {f"bench.perf.{name}" for line in perf for name in line.split()}
    assert run_by_bench == {m for m, cell in rows.items() if "`make bench`" in cell}


def test_a_script_left_out_of_the_table_is_seen():
    """Negative control: a table without one row differs from the scripts on disk."""
    readme = (BENCH / "README.md").read_text()
    shortened = "\n".join(line for line in readme.splitlines() if not line.startswith("| `bench.perf.sampling`"))
    assert set(_rows(shortened)) != _scripts()
