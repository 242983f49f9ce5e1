"""What the static-KV decoder reads from an HF model (``dtppo.generation.decoder_weights``): which architectures it
refuses and the phrase it gives, the shape of the computation it reads from a tiny Qwen2, the head reordering that
makes RoPE one complex multiply (checked in float64 against HF's rotate-half form), and the norm weights. Decoding
with them: tests/unit/generation/test_decoder_families.py."""

import math

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from dtppo.config import TinyModelConfig
from dtppo.generation.decoder_weights import (
    _Dims,
    interleave_heads,
    norm_weight,
    read_dims,
    read_layer,
    read_top,
    static_decoder_refusal,
)
from dtppo.models.causal_lm import build_causal_lm

TINY = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
SMALL = dict(vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)


def _qwen2():
    return build_causal_lm(None, TINY, 40, 0, 1, seed=0)


def test_a_tiny_qwen2_is_implemented_and_its_dims_are_read():
    model = _qwen2()
    assert static_decoder_refusal(model) is None
    dims, rope_kinds = read_dims(model)
    assert (dims.n_q, dims.n_kv, dims.head_dim, dims.act) == (4, 2, 8, "silu")
    assert dims.scale == pytest.approx(8**-0.5) and not dims.offset_norms and dims.final_softcap is None
    assert dims.rope_of_layer == (0, 0) and dims.mask_of_layer == (0, 0) and dims.windows == (None,)
    assert rope_kinds == [None]


@pytest.mark.parametrize(
    "model, phrase",
    [
        (lambda: GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=40)), "not this gpt2 model"),
        (lambda: LlamaForCausalLM(LlamaConfig(**SMALL, mlp_bias=True)), "MLP biases (llama, mlp_bias=true)"),
        (lambda: LlamaForCausalLM(LlamaConfig(**SMALL, hidden_act="relu")), "the relu activation (llama)"),
        (
            lambda: LlamaForCausalLM(LlamaConfig(**SMALL, rope_scaling={"rope_type": "dynamic", "factor": 2.0})),
            "does not implement dynamic RoPE (llama",
        ),
    ],
)
def test_an_architecture_it_does_not_implement_is_refused_in_one_phrase(model, phrase):
    refusal = static_decoder_refusal(model())
    assert refusal is not None and phrase in refusal and "\n" not in refusal


def test_mistrals_sliding_window_applies_to_every_layer():
    model = MistralForCausalLM(MistralConfig(**SMALL | {"num_hidden_layers": 2}, sliding_window=16))
    assert static_decoder_refusal(model) is None
    dims, _ = read_dims(model)
    assert dims.windows == (16,) and dims.mask_of_layer == (0, 0)


def _rope_hf(x, theta):
    """HF's rotate-half RoPE on one head [D] at angles theta [D/2]: x·cos + rotate_half(x)·sin, float64."""
    cos, sin = torch.cat([theta.cos(), theta.cos()]), torch.cat([theta.sin(), theta.sin()])
    half = x.shape[0] // 2
    return x * cos + torch.cat([-x[half:], x[:half]]) * sin


def test_interleaved_heads_make_rope_one_complex_multiply():
    torch.manual_seed(0)
    x, theta = torch.randn(8, dtype=torch.float64), torch.rand(4, dtype=torch.float64) * math.pi
    pairs = torch.view_as_complex(interleave_heads(x, 1).reshape(4, 2).contiguous())
    rotated = torch.view_as_real(pairs * torch.polar(torch.ones_like(theta), theta)).reshape(8)
    torch.testing.assert_close(rotated, interleave_heads(_rope_hf(x, theta), 1), rtol=0, atol=1e-12)


def test_interleaving_reorders_within_each_head_and_keeps_dot_products():
    rows = torch.arange(16.0)  # two heads of 8
    assert interleave_heads(rows, 2).tolist() == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]
    q, k = torch.randn(2 * 8, 3), torch.randn(2 * 8, 3)
    torch.testing.assert_close(interleave_heads(q, 2).T @ interleave_heads(k, 2), q.T @ k)


def test_norm_weights_are_as_is_or_gemmas_one_plus_w_in_fp32():
    w = torch.tensor([0.5, -0.25], dtype=torch.bfloat16)
    dims = _Dims(4, 2, 8, 1e-6, 0.35, False, "silu", None, (0,), (0,), (None,))
    assert norm_weight(w, dims) is w
    offset = norm_weight(w, _Dims(4, 2, 8, 1e-6, 0.35, True, "gelu_pytorch_tanh", None, (0,), (0,), (None,)))
    assert offset.dtype == torch.float32 and offset.tolist() == [1.5, 0.75]


def test_a_layers_weights_are_stacked_in_the_decoders_layout():
    model = _qwen2()
    dims, _ = read_dims(model)
    layer = model.model.layers[0]
    weights = read_layer(layer, dims)
    attn = layer.self_attn
    assert weights.qkv.shape == ((4 + 2 * 2) * 8, 32) and weights.gate_up.shape == (2 * 64, 32)
    assert torch.equal(weights.qkv[:32], interleave_heads(attn.q_proj.weight, 4))
    assert torch.equal(weights.qkv[48:], attn.v_proj.weight)  # values keep HF's order
    assert torch.equal(weights.qkv_bias[32:48], interleave_heads(attn.k_proj.bias, 2))  # Qwen2's q/k/v biases
    embed, scale, final_norm, head = read_top(model, dims)
    assert scale is None and head is embed  # the tiny model ties its head to the embedding
    assert final_norm is model.model.norm.weight
