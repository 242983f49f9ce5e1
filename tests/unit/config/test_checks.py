"""The rules that span sections (``dtppo.config.checks``): batches over the ranks, layouts, GRPO without a critic,
what the vLLM backend does not support; each refused naming its key."""

from __future__ import annotations

import pytest

from dtppo import config as config_lib
from dtppo.config import ConfigError
from tests.support.bad_configs import assert_refused, ids
from tests.support.recipes import TINY


@pytest.fixture(autouse=True)
def _cwd(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)


BAD = [
    ("batch layout", ["policy.train_global_batch_size=48"], "policy.train_global_batch_size"),
    ("batch layout", ["value.train_micro_batch_size=5"], "value.train_micro_batch_size"),
    ("batch layout", ["cluster.workers_per_node=3"], "policy.train_global_batch_size"),
    ("parallel layout", ["cluster.workers_per_node=2", "policy.parallel.tp=4"], "policy.parallel.tp"),
    (
        "parallel layout",
        ["cluster.workers_per_node=4", "policy.train_micro_batch_size=8", "value.parallel.tp=4"],
        "value.parallel.tp",
    ),
    (
        "parallel layout",
        ["cluster.workers_per_node=2", "policy.parallel.dp_replicate=4"],
        "policy.parallel.dp_replicate",
    ),
    (
        "parallel layout",
        [
            "cluster.workers_per_node=2",
            "policy.train_micro_batch_size=8",
            "value.parallel.tp=2",
            "value.parallel.dp_replicate=2",
        ],
        "value.parallel.dp_replicate",
    ),
    ("parallel layout", ["cluster.workers_per_node=2", "policy.parallel.cp=4"], "policy.parallel.cp"),
    (
        "parallel layout",
        ["cluster.workers_per_node=4", "value.parallel.cp=2", "value.parallel.tp=2", "value.parallel.dp_replicate=2"],
        "value.parallel.dp_replicate",
    ),
    (
        "parallel layout",
        ["cluster.workers_per_node=2", "policy.parallel.cp=2", "policy.generation.backend=vllm"],
        "policy.parallel.cp",
    ),
    ("grpo", ["ppo.advantage_estimator=grpo"], "ppo.num_generations_per_prompt"),
    (
        "grpo",
        ["ppo.advantage_estimator=grpo", "ppo.num_generations_per_prompt=2", "value.warmup.steps=5"],
        "value.warmup.steps",
    ),
    (
        "grpo",
        [
            "ppo.advantage_estimator=grpo",
            "ppo.num_generations_per_prompt=2",
            "loss.kl.coef=0.1",
            "loss.kl.in_reward=true",
        ],
        "loss.kl.in_reward",
    ),
    ("async", ["ppo.max_lag=1", "loss.rollout_correction.importance_sampling=token"], "ppo.max_lag"),
    (
        "async",
        ["cluster.workers_per_node=2", "cluster.generation_ranks=1", "ppo.max_lag=2"],
        "loss.rollout_correction.importance_sampling",
    ),
    (
        "vtrace",
        ["ppo.advantage_estimator=grpo", "ppo.num_generations_per_prompt=2", "value.target_correction=vtrace"],
        "value.target_correction",
    ),
]


@pytest.mark.parametrize("kind, overrides, key", BAD, ids=ids(BAD))
def test_a_bad_value_is_refused_naming_its_key(kind, overrides, key):
    assert_refused(kind, overrides, key)


def test_batch_divisibility_message_names_both_keys():
    with pytest.raises(ConfigError) as err:
        config_lib.load("recipes/tiny-math-cpu.yaml", ["policy.train_global_batch_size=48"])
    assert "ppo.num_prompts_per_step" in str(err.value)


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


def test_grpo_ignores_the_critic_sections_it_does_not_build():
    cfg = config_lib.load(
        TINY,
        [
            "ppo.advantage_estimator=grpo",
            "ppo.num_generations_per_prompt=4",
            "ppo.num_prompts_per_step=2",
            "policy.train_global_batch_size=8",
            "policy.train_micro_batch_size=8",
        ],
    )
    assert cfg.samples_per_step == 8 and cfg.value.train_global_batch_size == 32  # would not divide 8 with gae
    with pytest.raises(ConfigError, match="^value.train_global_batch_size:"):
        config_lib.load(
            TINY, ["ppo.num_prompts_per_step=8", "policy.train_global_batch_size=8", "policy.train_micro_batch_size=8"]
        )


VLLM_UNSUPPORTED = [
    (["cluster.workers_per_node=2", "policy.train_micro_batch_size=8", "policy.parallel.tp=2"], "policy.parallel.tp"),
    (["cluster.workers_per_node=2", "cluster.policy_ranks=1"], "cluster.policy_ranks"),
    (["policy.generation.top_p=0.9"], "policy.generation.top_p"),
    (["policy.generation.vllm_kv_cache_mib=0"], "policy.generation.vllm_kv_cache_mib"),
    (["policy.generation.decode_graph=true"], "policy.generation.decode_graph"),
    (["policy.generation.decoder=static"], "policy.generation.decoder"),
]


@pytest.mark.parametrize("overrides, key", VLLM_UNSUPPORTED, ids=[k for _, k in VLLM_UNSUPPORTED])
def test_what_the_vllm_backend_does_not_support_is_refused(overrides, key):
    assert config_lib.load(TINY, ["policy.generation.backend=vllm"]).policy.generation.backend == "vllm"
    with pytest.raises(ConfigError) as err:
        config_lib.load(TINY, ["policy.generation.backend=vllm", *overrides])
    assert str(err.value).startswith(key + ":"), err.value


def test_check_judges_a_config_built_without_load():
    # the sections check their own fields when built; what spans sections is check's, run by load and from_dict
    from dtppo.config import Config, PPOConfig
    from dtppo.config.checks import check

    check(Config())
    with pytest.raises(ConfigError, match=r"^policy.train_global_batch_size:"):
        check(Config(ppo=PPOConfig(num_prompts_per_step=3)))
