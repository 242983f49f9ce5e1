"""LoRA (models.lora, models.weights): merged weights against PEFT's own merge, the plain names a generator loads,
PEFT's adapter format both ways, the config's rules, and the engine's trainable-only optimizer."""

import copy
import json

import pytest
import torch
from peft import PeftModel, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from dtppo.config import ConfigError, LoraConfig, OptimizerConfig, SchedulerConfig
from dtppo.errors import InputError
from dtppo.models.lora import (
    adapters_disabled,
    add_adapters,
    frozen_base,
    merged_model,
    peft_config,
    save_adapter,
)
from dtppo.models.weights import full_parameters, load_weights, weight_names
from dtppo.workers.updater import Updater
from tests.support.recipes import tiny_config

LORA = LoraConfig(rank=4, alpha=8.0)
VOCAB = 40


def _qwen(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config).eval()


def _gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=32, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0
    )
    return GPT2LMHeadModel(config).eval()


def _trained(model, lora: LoraConfig = LORA, seed: int = 1):
    """``model`` with adapters whose B is random (a fresh adapter's B = 0 would merge to nothing)."""
    add_adapters(model, lora, seed=0)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.3)
    return model


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


IDS = torch.randint(0, VOCAB, (3, 11), generator=torch.Generator().manual_seed(7))


def test_a_fresh_adapter_leaves_the_model_unchanged_and_freezes_the_base():
    plain = _qwen()
    adapted = add_adapters(copy.deepcopy(plain), LORA, seed=0)
    assert torch.equal(_logits(adapted, IDS), _logits(plain, IDS))  # B = 0
    trainable = {n for n, p in adapted.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(trainable) == 2 * 7 * 2  # A and B on all 7 linear layers of both blocks, not the LM head
    again = add_adapters(_qwen(), LORA, seed=0)
    assert all(torch.equal(p, q) for p, q in zip(adapted.parameters(), again.parameters()))  # seeded A


@pytest.mark.parametrize("build", [_qwen, _gpt2])
def test_merged_weights_equal_peft_merge_and_unload(build):
    adapted = _trained(build())
    ours = merged_model(adapted)
    # PEFT's own merge on an independent PeftModel holding the same adapter.
    peft_model = get_peft_model(build(), peft_config(LORA))
    adapter = {"base_model.model." + k: v for k, v in adapted.state_dict().items() if ".lora_" in k}
    assert not peft_model.load_state_dict(adapter, strict=False).unexpected_keys
    reference = peft_model.merge_and_unload().eval()
    theirs = dict(reference.named_parameters())
    for name, param in ours.named_parameters():
        assert float((param - theirs[name]).abs().max()) < 1e-6, name
    assert float((_logits(ours, IDS) - _logits(adapted, IDS)).abs().max()) < 1e-5
    assert float((_logits(ours, IDS) - _logits(build(), IDS)).abs().max()) > 1e-2  # the adapter mattered
    assert not hasattr(ours, "peft_config") and merged_model(build()) is not None


def test_full_parameters_stream_the_merged_model_under_plain_names():
    adapted = _trained(_qwen())
    streamed = list(full_parameters(adapted, torch.device("cpu")))
    merged = merged_model(adapted)
    assert sorted(n for n, _ in streamed) == sorted(n for n, _ in merged.named_parameters(remove_duplicate=False))
    expected = dict(merged.named_parameters(remove_duplicate=False))
    assert max(float((t - expected[n]).abs().max()) for n, t in streamed) < 1e-6
    assert weight_names(adapted) == weight_names(_qwen())
    replica = _qwen(seed=3)
    load_weights(replica, full_parameters(adapted, torch.device("cpu")))
    assert float((_logits(replica, IDS) - _logits(adapted, IDS)).abs().max()) < 1e-5


def test_load_weights_refuses_a_stream_that_misses_a_parameter():
    stream = [(n, t) for n, t in full_parameters(_qwen(), torch.device("cpu")) if "layers.1.mlp" not in n]
    with pytest.raises(ValueError, match="no weights for 3 parameters"):
        load_weights(_qwen(), stream)


def test_adapters_disabled_computes_the_frozen_base_and_restores_the_adapter():
    base = _qwen()
    adapted = _trained(copy.deepcopy(base))
    with adapters_disabled(adapted):
        assert torch.equal(_logits(adapted, IDS), _logits(base, IDS))
    assert float((_logits(adapted, IDS) - _logits(base, IDS)).abs().max()) > 1e-2
    assert all(p.requires_grad for n, p in adapted.named_parameters() if ".lora_" in n)
    assert torch.equal(_logits(frozen_base(adapted), IDS), _logits(base, IDS))


def test_saved_adapter_loads_with_peft_and_as_a_starting_adapter(tmp_path):
    base = _qwen()
    adapted = _trained(copy.deepcopy(base))
    save_adapter(adapted, LORA, tmp_path / "adapter", base_model=None)
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert saved["r"] == 4 and saved["lora_alpha"] == 8.0 and saved["task_type"] == "CAUSAL_LM"
    loaded = PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "adapter").eval()
    assert float((_logits(loaded, IDS) - _logits(adapted, IDS)).abs().max()) < 1e-6
    started = add_adapters(
        copy.deepcopy(base), LoraConfig(rank=4, alpha=8.0, adapter_path=str(tmp_path / "adapter")), 0
    )
    assert torch.equal(_logits(started, IDS), _logits(adapted, IDS))


def test_a_starting_adapter_that_does_not_fit_is_refused(tmp_path):
    adapted = _trained(_qwen())
    save_adapter(adapted, LORA, tmp_path / "adapter", base_model=None)
    with pytest.raises(InputError, match=r"r 4 \(config: 8\)"):
        add_adapters(_qwen(), LoraConfig(rank=8, alpha=8.0, adapter_path=str(tmp_path / "adapter")), 0)
    (tmp_path / "adapter" / "adapter_model.safetensors").rename(tmp_path / "adapter" / "adapter_model.bin")
    with pytest.raises(InputError, match="never unpickled"):
        add_adapters(_qwen(), LoraConfig(rank=4, alpha=8.0, adapter_path=str(tmp_path / "adapter")), 0)


def test_lora_config_rules():
    cfg = tiny_config("policy.lora.rank=8", "policy.lora.target_modules=all-linear")
    assert cfg.policy.lora.enabled and cfg.policy.lora.target_modules == ("all-linear",)
    assert not cfg.value.lora.enabled  # rank 0 = full fine-tuning, the default
    bad = [
        (["policy.lora.rank=-1"], "policy.lora.rank"),
        (["value.lora.rank=4", "value.lora.alpha=0"], "value.lora.alpha"),
        (["policy.lora.rank=4", "policy.lora.dropout=1.0"], "policy.lora.dropout"),
        (["policy.lora.adapter_path=x"], "policy.lora.adapter_path: needs rank > 0"),
        (["policy.lora.rank=4", "policy.lora.target_modules=[all-linear,q_proj]"], "all-linear stands alone"),
    ]
    for overrides, message in bad:
        with pytest.raises(ConfigError, match=message):
            tiny_config(*overrides)
    with pytest.raises(ConfigError, match="value.parallel.tp: must be 1 with value.lora.rank > 0"):
        tiny_config("value.lora.rank=4", "value.parallel.tp=2", "cluster.workers_per_node=2")


def test_the_engine_steps_and_clips_only_the_adapters():
    model = _trained(_qwen())
    engine = Updater(model, OptimizerConfig(lr=1e-2), SchedulerConfig(), max_grad_norm=1e9)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert engine.optimizer.param_groups[0]["params"] == trainable
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    loss = model(input_ids=IDS, labels=IDS).loss
    loss.backward()
    expected = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in trainable]))
    norm = engine.optimizer_step()
    assert abs(float(norm) - float(expected)) < 1e-6
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if not p.requires_grad)
    assert len(engine.optimizer.state) == len(trainable)
