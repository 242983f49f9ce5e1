"""Every recipe the docs show (a ```yaml block in README.md or docs/guides/) builds a Config, with the current key
names: a user who copies one gets a recipe that loads, not a notice about a renamed key."""

from __future__ import annotations

import re

import pytest
import yaml

from dtppo.config import ConfigError, from_dict
from dtppo.config.renames import migrate
from tests.support.recipes import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs" / "guides").glob("*.md"))]


def yaml_blocks(text: str) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", text, re.S)


def renamed_keys(block: str) -> list[str]:
    """The old names a recipe block uses (none for a current one); raises ConfigError for a block that is no
    recipe."""
    tree = yaml.safe_load(block)
    if not isinstance(tree, dict):
        raise ConfigError("recipe: a recipe is a mapping")
    tree.pop("defaults", None)
    before = repr(tree)
    migrate(tree, notice=False)
    from_dict(tree)
    return [] if repr(tree) == before else ["renamed"]


BLOCKS = [(page.name, i, block) for page in PAGES for i, block in enumerate(yaml_blocks(page.read_text()))]


def test_the_docs_show_recipes():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize(("page", "index", "block"), BLOCKS, ids=[f"{p}-{i}" for p, i, _ in BLOCKS])
def test_each_recipe_in_the_docs_loads_with_current_names(page, index, block):
    assert renamed_keys(block) == [], f"{page} block {index} uses a renamed key"


def test_the_check_sees_an_old_name_and_a_bad_value():
    # negative controls: an old key is reported, a value out of range is refused
    assert renamed_keys("ppo:\n  val_period: 3\n") == ["renamed"]
    with pytest.raises(ConfigError, match="ppo.validation.period"):
        renamed_keys("ppo:\n  validation:\n    period: 0\n")
