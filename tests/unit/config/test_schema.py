"""The Config tree (``dtppo.config.schema``): frozen, its derived values computed once, per-rank batch sizes as
upper bounds."""

from __future__ import annotations

import dataclasses

import pytest

from dtppo import config as config_lib


@pytest.fixture(autouse=True)
def _cwd(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)


def test_config_is_frozen():
    cfg = config_lib.load("recipes/base.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.ppo.seed = 3


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
