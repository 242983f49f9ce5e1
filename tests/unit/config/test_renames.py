"""Keys that moved into their feature's subsection: a recipe, an override or a checkpoint written with the old name
loads as the new one, with one line naming the new key (none for a checkpoint's own config)."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from dtppo.config import RENAMES, Config, ConfigError, from_dict, load
from dtppo.config.renames import migrate
from tests.support.recipes import REPO


def _value_at(cfg: Config, dotted: str):
    node = cfg
    for name in dotted.split("."):
        node = getattr(node, name)
    return node


def test_every_new_key_exists_and_no_old_key_does():
    cfg = Config()
    for old, new in RENAMES.items():
        _value_at(cfg, new)  # raises AttributeError for a table entry that names no field
        with pytest.raises(AttributeError):
            _value_at(cfg, old)


@pytest.mark.parametrize(
    ("old", "raw", "expected"),
    [
        ("ppo.val_period", "3", 3),
        ("policy.generation.val_greedy", "false", False),
        ("ppo.policy_training_start_step", "2", 2),
        ("loss.kl_coef", "0.05", 0.05),
        ("loss.rollout_is", "token", "token"),
        ("value.vtrace_c_cap", "0.5", 0.5),
        ("ppo.seq_logprob_error_threshold", "1.5", 1.5),
    ],
)
def test_an_old_key_in_a_recipe_and_as_an_override_loads_as_the_new_one(tmp_path, capfd, old, raw, expected):
    new = RENAMES[old]
    *parents, leaf = old.split(".")
    tree: dict = {}
    node = tree
    for name in parents:
        node = node.setdefault(name, {})
    node[leaf] = yaml.safe_load(raw)
    recipe = tmp_path / "old.yaml"
    recipe.write_text(yaml.safe_dump(tree))
    assert _value_at(load(recipe), new) == expected
    assert capfd.readouterr().err.strip().splitlines() == [
        f"config: {old} is now {new}; the recipe loads, but write {new}"
    ]
    assert _value_at(load(REPO / "recipes" / "tiny-math-cpu.yaml", [f"{old}={raw}"]), new) == expected
    assert f"config: {old} is now {new}; the override applies" in capfd.readouterr().err


def test_a_key_under_both_names_is_refused(tmp_path):
    recipe = tmp_path / "both.yaml"
    recipe.write_text("ppo:\n  val_period: 3\n  validation:\n    period: 4\n")
    with pytest.raises(ConfigError, match="ppo.val_period: renamed ppo.validation.period, and the recipe sets both"):
        load(recipe)


def test_a_parent_recipe_with_old_names_under_a_child_with_new_ones(tmp_path):
    # each file is migrated before the merge, so the child's new key overrides the parent's old one
    (tmp_path / "parent.yaml").write_text("loss:\n  kl_coef: 0.1\n  kl_estimator: k1\n")
    (tmp_path / "child.yaml").write_text("defaults: parent.yaml\nloss:\n  kl:\n    coef: 0.2\n")
    cfg = load(tmp_path / "child.yaml")
    assert (cfg.loss.kl.coef, cfg.loss.kl.estimator) == (0.2, "k1")


def test_a_checkpoints_config_with_old_names_migrates_silently(capfd):
    saved = Config().to_dict()
    saved["ppo"]["val_period"] = saved["ppo"].pop("validation")["period"]
    saved["loss"]["kl_coef"] = 0.25
    del saved["loss"]["kl"]["coef"]
    cfg = from_dict(saved)
    assert (cfg.ppo.validation.period, cfg.loss.kl.coef) == (10, 0.25)
    assert capfd.readouterr().err == ""


def test_migrate_leaves_a_current_tree_alone():
    tree = Config().to_dict()
    assert migrate(dataclasses.replace(Config()).to_dict(), notice=False) == tree


def test_the_repositorys_recipes_use_the_current_names(capfd):
    for recipe in sorted((REPO / "recipes").glob("*.yaml")) + sorted((REPO / "examples").glob("*.yaml")):
        load(recipe)
        assert " is now " not in capfd.readouterr().err, f"{recipe.name} uses a renamed key"
