"""Recipes to a Config (``dtppo.config.loading``): overrides and inheritance, a round trip through a plain mapping,
and what is refused naming its key: unknown keys, wrong types, broken recipe files."""

from __future__ import annotations

import pytest

from dtppo import config as config_lib
from dtppo.config import ConfigError
from tests.support.bad_configs import assert_refused, ids
from tests.support.recipes import REPO


@pytest.fixture(autouse=True)
def _cwd(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)


BAD = [
    ("unknown key", ["ppo.max_num_stepz=2"], "ppo.max_num_stepz"),
    ("unknown key", ["policy.model.tiny.hidden=64"], "policy.model.tiny.hidden"),
    ("unknown key", ["data.train.paths=x.jsonl"], "data.train.paths"),
    ("unknown key", ["novel.section=1"], "novel"),
    ("syntax", ["ppo.seed"], "ppo.seed"),
    ("syntax", ["ppo.seed.x=1"], "ppo.seed.x"),
    ("wrong type", ["ppo.max_num_steps=abc"], "ppo.max_num_steps"),
    ("wrong type", ["ppo.seed=1.5"], "ppo.seed"),
    ("wrong type", ["logger.tensorboard=3"], "logger.tensorboard"),
    ("wrong type", ["data.system_prompt=[1, 2]"], "data.system_prompt"),
    ("wrong type", ["policy.optimizer.betas=[0.9, abc]"], "policy.optimizer.betas[1]"),
    ("wrong type", ["policy.model=3"], "policy.model"),
    ("wrong type", ["logger.log_dir="], "logger.log_dir"),
    ("wrong type", ["policy.generation.temperature=.nan"], "policy.generation.temperature"),
]


@pytest.mark.parametrize("kind, overrides, key", BAD, ids=ids(BAD))
def test_a_bad_value_is_refused_naming_its_key(kind, overrides, key):
    assert_refused(kind, overrides, key)


def test_overrides_and_inheritance():
    cfg = config_lib.load(
        "recipes/tiny-math-cpu.yaml",
        ["ppo.max_num_steps=2", "loss.ratio_clip_c=3", "logger.log_dir=x", "policy.optimizer.lr=3e-4"],
    )
    assert cfg.policy.optimizer.lr == 3e-4
    assert cfg.ppo.max_num_steps == 2 and cfg.loss.ratio_clip_c == 3.0 and cfg.logger.log_dir == "x"
    assert cfg.ppo.init_from_sft  # from the recipe
    assert cfg.value.optimizer.lr == 1e-3  # from base


@pytest.mark.parametrize(
    "override, key",
    [
        ("ppo.max_num_stepz=2", "ppo.max_num_stepz"),
        ("policy.optimizer.lr=-1", "policy.optimizer.lr"),
        ("policy.optimizer.lr=abc", "policy.optimizer.lr"),
        ("ppo.max_num_steps=1.5", "ppo.max_num_steps"),
        ("ppo.max_num_steps=true", "ppo.max_num_steps"),
        ("loss.kl.estimator=k9", "loss.kl.estimator"),
        ("loss.ratio_clip_c=0.5", "loss.ratio_clip_c"),
        ("loss.ratio_clip_low=1.5", "loss.ratio_clip_low"),
        ("ppo.gae.gamma=2", "ppo.gae.gamma"),
        ("policy.train_global_batch_size=48", "policy.train_global_batch_size"),
        ("value.train_micro_batch_size=5", "value.train_micro_batch_size"),
        ("policy.optimizer.betas=[0.9]", "policy.optimizer.betas"),
        ("cluster.workers_per_node=0", "cluster.workers_per_node"),
        ("cluster.num_nodes=-1", "cluster.num_nodes"),
        ("cluster.backend=slurm", "cluster.backend"),
        ("reward.num_workers=-1", "reward.num_workers"),
        ("value.parallel.tp=3", "value.parallel.tp"),
        ("value.parallel.sequence_parallel=true", "value.parallel.sequence_parallel"),
        ("ppo=3", "ppo"),
        ("novel.section=1", "novel"),
    ],
)
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        config_lib.load("recipes/tiny-math-cpu.yaml", [override])
    assert str(err.value).startswith(key + ":"), str(err.value)


def test_missing_recipe_and_cycle(tmp_path):
    with pytest.raises(ConfigError, match="recipe"):
        config_lib.load(tmp_path / "nope.yaml")
    (tmp_path / "a.yaml").write_text("defaults: b.yaml\n")
    (tmp_path / "b.yaml").write_text("defaults: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        config_lib.load(tmp_path / "a.yaml")


def test_round_trip_through_dict():
    cfg = config_lib.load("recipes/tiny-math-cpu.yaml", ["ppo.seed=9"])
    assert config_lib.from_dict(cfg.to_dict()) == cfg


BAD_RECIPES = [
    ("unknown key in a file", "defaults: {base}\nppo:\n  max_num_stepz: 3\n", "ppo.max_num_stepz"),
    ("missing parent", "defaults: nowhere.yaml\n", "defaults"),
    ("parent not a name", "defaults: [1, 2]\n", "defaults"),
    ("not YAML", "ppo: [unclosed\n", "recipe"),
    ("not a mapping", "- 1\n- 2\n", "recipe"),
    ("section is a scalar", "defaults: {base}\nloss: 0.2\n", "loss"),
]


@pytest.mark.parametrize("kind, text, key", BAD_RECIPES, ids=[k for k, _, _ in BAD_RECIPES])
def test_bad_recipe_file_is_refused_naming_the_key(tmp_path, kind, text, key):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(text.format(base=REPO / "recipes" / "base.yaml"))
    with pytest.raises(ConfigError) as err:
        config_lib.load(recipe)
    assert str(err.value).startswith(key + ":"), f"{kind}: {err.value}"


def test_apply_overrides_sets_dotted_keys_as_yaml_scalars():
    from dtppo.config.loading import apply_overrides

    overrides = ["ppo.seed=3", "loss.kl.coef=1e-3", "data.system_prompt=", "x.y=[1, 2]"]
    tree = apply_overrides({"ppo": {"seed": 1}}, overrides)
    # YAML 1.1 reads 1e-3 as a string; the build makes it a float
    expected = {
        "ppo": {"seed": 3},
        "loss": {"kl": {"coef": "1e-3"}},
        "data": {"system_prompt": None},
        "x": {"y": [1, 2]},
    }
    assert tree == expected
    with pytest.raises(ConfigError, match="overrides are written section.key=value"):
        apply_overrides({}, ["ppo.seed"])
    with pytest.raises(ConfigError, match=r"^ppo.seed.x: seed is not a section"):
        apply_overrides({"ppo": {"seed": 1}}, ["ppo.seed.x=1"])
