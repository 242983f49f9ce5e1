"""What a recipe asks of real model directories is checked by ``preflight``: one ConfigError naming the key, before
any model is built (tests/support/hf_fixtures.py builds the directories)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import Gemma3Config, Gemma3TextConfig, GPTNeoXJapaneseConfig

from dtppo.config import ConfigError
from dtppo.launch.preflight import preflight
from tests.support.hf_fixtures import (
    NO_SYSTEM_TEMPLATE,
    QWEN_TEMPLATE,
    with_chat_template,
    with_pickled_weights,
    without_tokenizer,
)
from tests.support.recipes import tiny_config


def load(model: Path, *overrides: str):
    cfg = tiny_config("ppo.init_from_sft=false", f"policy.model.path={model}", *overrides)
    preflight(cfg)
    return cfg


def two_ranks(*overrides: str) -> list[str]:
    return ["cluster.workers_per_node=2", *overrides]


def test_a_real_model_directory_loads(qwen_dir, llama_dir, gpt2_dir):
    for model in (qwen_dir, llama_dir, gpt2_dir):
        assert load(model, *two_ranks()).policy.model.path == str(model)


def test_tensor_parallelism_is_checked_against_the_real_heads(qwen_dir, llama_dir):
    # 2 query heads and 1 kv head (Qwen2.5-0.5B/1.5B's 7:1 at tp=4 would fail the same way, after a rollout)
    with pytest.raises(
        ConfigError,
        match=r"^policy\.parallel\.tp: 2 must divide the model's num_key_value_heads "
        r"\(1;",
    ):
        load(qwen_dir, *two_ranks("policy.parallel.tp=2"))
    with pytest.raises(ConfigError, match=r"^value\.parallel\.tp: 2 must divide the model's num_key_value_heads"):
        load(qwen_dir, *two_ranks("value.parallel.tp=2"))
    assert load(llama_dir, *two_ranks("policy.parallel.tp=2", "value.parallel.tp=2")).value.parallel.tp == 2


def test_an_architecture_the_tensor_parallel_plan_does_not_know_is_refused(gpt2_dir, capfd):
    with pytest.raises(
        ConfigError,
        match=r"^policy\.parallel\.tp: tensor parallelism supports Qwen2/Llama-style "
        r"blocks .*; gpt2 \(policy\.model\.path\) is laid out otherwise",
    ):
        load(gpt2_dir, *two_ranks("policy.parallel.tp=2"))
    # FSDP alone shards GPT-2 per block (transformer.h): no warning
    load(gpt2_dir, *two_ranks())
    assert "WARNING" not in capfd.readouterr().err


def test_a_critic_with_another_vocabulary_is_refused(qwen_dir, llama_dir):
    with pytest.raises(ConfigError, match=r"^value\.model\.path: its tokenizer \(\d+ tokens\) is not the policy's"):
        load(qwen_dir, f"value.model.path={llama_dir}")
    # the policy's own directory as the critic, or no critic (grpo), is fine
    assert load(qwen_dir, f"value.model.path={qwen_dir}").value.model.path == str(qwen_dir)
    load(qwen_dir, f"value.model.path={llama_dir}", "ppo.advantage_estimator=grpo", "ppo.num_generations_per_prompt=2")


def test_a_missing_chat_template_is_refused(qwen_dir, tmp_path):
    bare = with_chat_template(qwen_dir, tmp_path / "base-model", None)
    with pytest.raises(ConfigError, match=r"^policy\.model\.path: the tokenizer of .*base-model has no chat template"):
        load(bare)


def pickle_refusal(key: str, path: Path, model: str) -> str:
    return (
        f"{key}: {path}: no *.safetensors weights (found: pytorch_model.bin); {model} is loaded from safetensors "
        "only, never unpickled: convert it where you trust the file (from_pretrained, then save_pretrained writes "
        "safetensors)"
    )


@pytest.mark.parametrize(("key", "model"), [("policy.model.path", "the policy"), ("value.model.path", "the critic")])
def test_pickled_weights_are_refused_before_anything_is_unpickled(qwen_dir, tmp_path, key, model):
    marker = tmp_path / "payload-ran"
    pickled = with_pickled_weights(qwen_dir, tmp_path / "pickled", marker)
    policy = pickled if key == "policy.model.path" else qwen_dir
    with pytest.raises(ConfigError) as refused:
        load(policy, f"value.model.path={pickled}")
    assert str(refused.value) == pickle_refusal(key, pickled, model)
    assert not marker.exists()
    # Negative control: the payload does run when unpickled, so its absence above means nothing was
    torch.load(pickled / "pytorch_model.bin", weights_only=False)
    assert marker.exists()


def test_a_directory_without_tokenizer_files_is_named_with_the_files_it_lacks(qwen_dir, llama_dir, tmp_path):
    # A model saved without its tokenizer: transformers builds an empty Qwen2 tokenizer from config.json (every prompt
    # encodes to no tokens) and fails for Llama naming no file; before, the first was reported as "no chat template"
    # and, with one added, failed in the first rollout with a traceback.
    for name, source in (("qwen", qwen_dir), ("llama", llama_dir)):
        bare = without_tokenizer(source, tmp_path / f"bare-{name}")
        templated = without_tokenizer(source, tmp_path / f"templated-{name}", QWEN_TEMPLATE)
        for model in (bare, templated):
            with pytest.raises(ConfigError) as refused:
                load(model)
            assert str(refused.value) == (
                f"policy.model.path: {model} holds no tokenizer (none of tokenizer.json, tokenizer.model, vocab.json "
                "+ merges.txt, vocab.txt; tokenizer_config.json alone has no vocabulary), so every prompt would "
                "encode to no tokens: copy the tokenizer files of the model it was trained from into it"
            )
        # Negative control: the tokenizer file back, the directory loads
        (templated / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())
        assert load(templated).policy.model.path == str(templated)
    with pytest.raises(ConfigError, match=r"^value\.model\.path: .*bare-qwen holds no tokenizer \("):
        load(qwen_dir, f"value.model.path={tmp_path / 'bare-qwen'}")


def test_a_template_that_refuses_the_system_turn_is_named_with_the_system_prompt(qwen_dir, tmp_path):
    strict = with_chat_template(qwen_dir, tmp_path / "no-system", NO_SYSTEM_TEMPLATE)
    assert load(strict).data.system_prompt is None  # no system turn asked for: fine
    with pytest.raises(
        ConfigError,
        match=r"^data\.system_prompt: the chat template of .*no-system refuses a system "
        r"turn \(TemplateError: System role not supported\)",
    ):
        load(strict, "data.system_prompt=Be brief.")


def test_activation_checkpointing_is_refused_for_a_model_class_without_it(qwen_dir, tmp_path):
    # GPT-NeoX-Japanese: a transformers causal LM whose class has supports_gradient_checkpointing = False
    other = with_chat_template(qwen_dir, tmp_path / "neox-ja", QWEN_TEMPLATE)
    GPTNeoXJapaneseConfig(
        vocab_size=800, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_multiple_size=1
    ).to_json_file(str(other / "config.json"))
    assert load(other).policy.activation_checkpointing is False  # off by default: loads
    for section in ("policy", "value"):  # the critic starts from the policy's directory
        expected = (
            rf"^{section}\.activation_checkpointing: GPTNeoXJapanese(ForCausalLM|Model) \(gpt_neox_japanese, "
            rf"policy\.model\.path\) has no activation checkpointing in transformers"
        )
        with pytest.raises(ConfigError, match=expected):
            load(other, f"{section}.activation_checkpointing=true")
    assert load(
        qwen_dir, "policy.activation_checkpointing=true", "value.activation_checkpointing=true", *two_ranks()
    ).value.activation_checkpointing


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_a_head_size_the_vllm_cpu_build_cannot_run_is_refused():
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("a GPU build of vLLM has no such limit")
    vllm = ["policy.generation.backend=vllm", "policy.model.tiny.hidden_size=64"]  # 4 heads of 16
    with pytest.raises(
        ConfigError,
        match=r"^policy\.generation\.backend: vLLM's CPU build has attention kernels "
        r"for head sizes \[32, .*\], and the policy's is 16",
    ):
        preflight(tiny_config(*vllm))
    preflight(tiny_config(*vllm[:1]))  # 128 / 4 = 32


def test_a_critic_no_export_layout_can_write_is_refused_at_start(qwen_dir, tmp_path):
    # Gemma 3's multimodal config (its 4B+ checkpoints' format): its base model has no hidden_size for the value head,
    # so the critic could be neither built nor exported; refused here, on meta-device builds, in one line
    composite = with_chat_template(qwen_dir, tmp_path / "gemma3", QWEN_TEMPLATE)
    Gemma3Config().to_json_file(str(composite / "config.json"))
    with pytest.raises(ConfigError) as err:
        load(qwen_dir, f"value.model.path={composite}")
    message = str(err.value)
    assert message.startswith(f"value.model.path: a critic starting from {composite} (gemma3) could not be built or ")
    assert "has no hidden_size for the value head" in message and "\n" not in message
    # negative control: Gemma 3's text config has no token-classification class either, and is written as the base
    # model plus its head: it passes
    text = with_chat_template(qwen_dir, tmp_path / "gemma3-text", QWEN_TEMPLATE)
    Gemma3TextConfig(vocab_size=800, hidden_size=32, num_hidden_layers=2, head_dim=16).to_json_file(
        str(text / "config.json")
    )
    assert load(qwen_dir, f"value.model.path={text}").value.model.path == str(text)
