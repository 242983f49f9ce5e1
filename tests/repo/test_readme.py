"""README.md's generated blocks are what their scripts render from the kept runs (bench/learning/readme_demo.py from
a `make demo` run, bench/device/quickstart.py from a run of the quickstart recipe), and the README stays short."""

import json

from bench.common.paths import DEVICE, LEARNING
from bench.common.readme import with_block
from bench.device import quickstart
from bench.learning import readme_demo
from tests.support.recipes import REPO

README = (REPO / "README.md").read_text()


def _load(name: str) -> dict:
    return json.loads((LEARNING / name).read_text())


def test_the_demo_block_is_rendered_from_the_kept_make_demo_run():
    expected = _load("demo_expected.json")
    block = readme_demo.render(_load("demo_readme.json"), expected)
    assert with_block(README, readme_demo.BLOCK, block) == README, (
        "python -m bench.learning.readme_demo after make demo"
    )


def test_the_quickstart_block_is_rendered_from_the_kept_run():
    kept = sorted(DEVICE.glob("quickstart_*.json"))
    cuda = DEVICE / "quickstart_cuda.json"
    result = json.loads((cuda if cuda.exists() else kept[0]).read_text())
    block = quickstart.render(result)
    assert with_block(README, quickstart.BLOCK, block) == README, "python -m bench.device.quickstart"
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
