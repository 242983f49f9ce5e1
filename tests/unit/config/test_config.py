"""Recipes to a Config: overrides and inheritance, a frozen tree, values refused naming the key, batch sizes among
ranks, a round trip through a plain mapping. (The repository's own recipes: tests/repo/test_recipes.py.)"""

import dataclasses

import pytest

from dtppo import config as config_lib
from dtppo.config import ConfigError


@pytest.fixture(autouse=True)
def _cwd(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)


def test_overrides_and_inheritance():
    cfg = config_lib.load(
        "recipes/tiny-math-cpu.yaml",
        ["ppo.max_num_steps=2", "loss.ratio_clip_c=3", "logger.log_dir=x", "policy.optimizer.lr=3e-4"],
    )
    assert cfg.policy.optimizer.lr == 3e-4
    assert cfg.ppo.max_num_steps == 2 and cfg.loss.ratio_clip_c == 3.0 and cfg.logger.log_dir == "x"
    assert cfg.ppo.init_from_sft  # from the recipe
    assert cfg.value.optimizer.lr == 1e-3  # from base


def test_config_is_frozen():
    cfg = config_lib.load("recipes/base.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.ppo.seed = 3


@pytest.mark.parametrize(
    "override, key",
    [
        ("ppo.max_num_stepz=2", "ppo.max_num_stepz"),
        ("policy.optimizer.lr=-1", "policy.optimizer.lr"),
        ("policy.optimizer.lr=abc", "policy.optimizer.lr"),
        ("ppo.max_num_steps=1.5", "ppo.max_num_steps"),
        ("ppo.max_num_steps=true", "ppo.max_num_steps"),
        ("loss.kl_estimator=k9", "loss.kl_estimator"),
        ("loss.ratio_clip_c=0.5", "loss.ratio_clip_c"),
        ("loss.ratio_clip_low=1.5", "loss.ratio_clip_low"),
        ("ppo.gamma=2", "ppo.gamma"),
        ("policy.train_global_batch_size=48", "policy.train_global_batch_size"),
        ("value.train_micro_batch_size=5", "value.train_micro_batch_size"),
        ("policy.optimizer.betas=[0.9]", "policy.optimizer.betas"),
        ("data.task=gsm8k", "data.train.path"),
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


def test_batch_divisibility_message_names_both_keys():
    with pytest.raises(ConfigError) as err:
        config_lib.load("recipes/tiny-math-cpu.yaml", ["policy.train_global_batch_size=48"])
    assert "ppo.num_prompts_per_step" in str(err.value)


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


def test_micro_batch_is_an_upper_bound_per_rank():
    tiny = "recipes/tiny-math-cpu.yaml"
    one = config_lib.load(tiny)
    assert one.micro_batch_size("policy") == 32 and config_lib.batch_clamp_notes(one) == []
    two = config_lib.load(tiny, ["cluster.workers_per_node=2"])  # no micro-batch overrides needed
    assert (two.data_parallel_size("policy"), two.micro_batch_size("policy"), two.micro_batch_size("value")) == (
        2,
        16,
        16,
    )
    assert config_lib.batch_clamp_notes(two) == [
        "policy: per-rank sizes clamped to a rank's share over 2 data-parallel ranks: "
        "train_micro_batch_size 32 -> 16, logprob_batch_size 64 -> 32",
        "value: per-rank sizes clamped to a rank's share over 2 data-parallel ranks: "
        "train_micro_batch_size 32 -> 16, inference_batch_size 64 -> 32",
    ]
    # a smaller micro batch is kept; each pool clamps against its own data-parallel ranks
    assert (
        config_lib.load(tiny, ["cluster.workers_per_node=2", "policy.train_micro_batch_size=8"]).micro_batch_size(
            "policy"
        )
        == 8
    )
    pools = config_lib.load(
        tiny, ["cluster.workers_per_node=3", "cluster.policy_ranks=1", "value.train_global_batch_size=16"]
    )
    assert (pools.micro_batch_size("policy"), pools.micro_batch_size("value")) == (32, 8)
    tp = config_lib.load(tiny, ["cluster.workers_per_node=2", "value.parallel.tp=2"])
    assert (tp.data_parallel_size("value"), tp.micro_batch_size("value")) == (1, 32)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["cluster.workers_per_node=3"], "policy.train_global_batch_size"),  # 32 samples do not split over 3 ranks
        (["cluster.workers_per_node=2", "value.train_micro_batch_size=5"], "value.train_micro_batch_size"),
    ],
)
def test_batches_that_do_not_split_among_ranks_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=rf"^{key}:"):
        config_lib.load("recipes/tiny-math-cpu.yaml", overrides)
