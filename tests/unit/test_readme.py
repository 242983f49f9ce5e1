"""README.md's generated blocks are what their scripts render from the kept runs (bench/readme_demo.py from a
`make demo` run, bench/gpu_quickstart.py from a run of the quickstart recipe), and the README stays short."""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import gpu_quickstart  # noqa: E402
import readme_demo  # noqa: E402
from readme_blocks import with_block  # noqa: E402

README = (REPO / "README.md").read_text()


def _load(name: str) -> dict:
    return json.loads((REPO / "bench" / "results" / name).read_text())


def test_the_demo_block_is_rendered_from_the_kept_make_demo_run():
    expected = _load("demo_expected.json")
    block = readme_demo.render(_load("demo_readme.json"), expected)
    assert with_block(README, readme_demo.BLOCK, block) == README, "python bench/readme_demo.py after make demo"


def test_the_quickstart_block_is_rendered_from_the_kept_run():
    kept = sorted((REPO / "bench" / "results").glob("quickstart_*.json"))
    result = _load("quickstart_cuda.json" if (REPO / "bench/results/quickstart_cuda.json").exists() else kept[0].name)
    block = gpu_quickstart.render(result)
    assert with_block(README, gpu_quickstart.BLOCK, block) == README, "python bench/gpu_quickstart.py"
    assert result["passed"] is True


def test_a_changed_run_changes_the_block():
    """Negative control: another accuracy in the kept run gives another README."""
    kept = _load("demo_readme.json")
    kept["runs"][0]["result"]["accuracy_final"] += 0.01
    block = readme_demo.render(kept, _load("demo_expected.json"))
    assert with_block(README, readme_demo.BLOCK, block) != README


def test_the_readme_is_at_most_200_lines_and_links_only_what_exists():
    assert len(README.splitlines()) <= 200
    import re

    for target in re.findall(r"\]\(([^)#]+)", README):
        assert (REPO / target).exists(), target
