"""The static-KV decoder on the model families of 2026, each built from a small config here: Qwen3 (q/k norms, a
``head_dim`` other than hidden/heads), Llama 3.x (``llama3`` RoPE scaling; linear, and YaRN, whose attention factor HF
folds into cos/sin), Mistral without and with a sliding window, Qwen2 with sliding layers, and Gemma 3 text (sliding and
global layers with their own RoPE bases, q/k norms, (1 + w) norms around attention and MLP, scaled embeddings,
GELU-tanh, ``query_pre_attn_scalar``, final logit softcapping). Windows are shorter than prompt + response, so they
matter. Each family: the same sampled and greedy tokens as HF's decoding, log-probs within 1e-5 of it and of a full
HF forward; a decoder with the q/k norms, the window or the RoPE scaling switched off is caught; ``auto`` picks the
static decoder, and where it does not implement a config it falls back to HF and its line says why."""

import dataclasses

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from dtppo.generation import decoder as decoder_module
from dtppo.generation.generator import TorchGenerator, resolve_decoder
from dtppo.models.attention import KERNEL
from dtppo.ops import logprobs_from_logits
from dtppo.types import SampleRequest, SamplingParams
from tests.unit.generation.test_generator_decode_graph import _same_or_a_tie
from tests.unit.models.test_attention import _LargestTensor

PAD, NEW_TOKENS = 0, 12
# Left-padded to 11 columns; with 12 new tokens the longest row reaches 23 positions, past every window below.
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12], [13, 14], [15, 16, 17, 18, 19], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]
# initializer_range 0.1 (HF's default 0.02 gives near-uniform attention, where positions and windows hardly move
# the logits): the negative controls then miss by 0.5-3 nats, where the real decoder agrees to ~1e-6.
COMMON = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    pad_token_id=PAD,
    eos_token_id=1,
    bos_token_id=1,
    initializer_range=0.1,
)
LLAMA3_ROPE = dict(
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=16,
    rope_theta=10000.0,
)
GEMMA3_LAYERS = ["sliding_attention", "full_attention", "sliding_attention"]
GEMMA3_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
}
CONFIGS = {
    "qwen3": lambda: Qwen3Config(**COMMON, head_dim=24, attention_bias=False),
    "llama3": lambda: LlamaConfig(**COMMON, rope_parameters=LLAMA3_ROPE),
    "llama-yarn": lambda: LlamaConfig(
        **COMMON,
        rope_parameters=dict(rope_type="yarn", factor=16.0, original_max_position_embeddings=16, rope_theta=1e4),
    ),
    "llama-linear": lambda: LlamaConfig(**COMMON, rope_parameters=dict(rope_type="linear", factor=4.0, rope_theta=1e4)),
    "mistral": lambda: MistralConfig(**COMMON, sliding_window=None),
    "mistral-window": lambda: MistralConfig(**COMMON, sliding_window=6),
    "qwen2-window": lambda: Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=5, max_window_layers=1),
    "gemma3": lambda: Gemma3TextConfig(
        **COMMON,
        head_dim=16,
        sliding_window=5,
        layer_types=GEMMA3_LAYERS,
        rope_parameters=GEMMA3_ROPE,
        query_pre_attn_scalar=12,
        final_logit_softcapping=3.0,
    ),
}


def _model(family: str):
    """A random fp32 model of ``family``, SDPA attention as dtppo loads it, its norm weights moved off their
    initial ones (1, or Gemma's 0) so that a norm read wrong shows."""
    config = CONFIGS[family]()
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.add_(0.3 * torch.randn_like(param))
    return model


def _both(model, params: SamplingParams):
    """The static decoder's rollout and HF's (the model's forward + cache), same keys; no stop token, so that
    every step is compared."""
    request = SampleRequest(PROMPTS, params, 11, torch.arange(len(PROMPTS)))
    static = TorchGenerator(model, (-1,), PAD, "static").sample(request)
    hf = TorchGenerator(model, (-1,), PAD, "hf").sample(request)
    return static, hf


def _apart(static, hf) -> bool:
    """The two rollouts differ: other tokens, or log-probs more than 1e-3 apart."""
    return (
        not torch.equal(static.input_ids, hf.input_ids)
        or float((static.gen_logprobs - hf.gen_logprobs).abs().max()) > 1e-3
    )


@pytest.mark.parametrize("family", list(CONFIGS))
@pytest.mark.parametrize("greedy", [False, True])
def test_static_decoder_matches_hf_decoding(family, greedy):
    model = _model(family)
    auto = TorchGenerator(model, (-1,), PAD)
    assert (
        auto.decoder == "static"
        and auto.describe() == f"torch backend, static decoder ({model.config.model_type} model)"
    )
    static, hf = _both(model, SamplingParams(NEW_TOKENS, greedy=greedy))
    assert int(static.response_mask.sum()) == len(PROMPTS) * NEW_TOKENS
    assert torch.equal(static.input_ids, hf.input_ids) and torch.equal(static.response_mask, hf.response_mask)
    assert float((static.gen_logprobs - hf.gen_logprobs).abs().max()) < 1e-5
    with torch.no_grad():
        full = logprobs_from_logits(
            model(input_ids=static.input_ids, attention_mask=static.attention_mask).logits, static.input_ids
        )
    assert float(((full - static.gen_logprobs).abs() * static.response_mask).max()) < 1e-5


def _without_qk_norms(monkeypatch):
    weights = decoder_module.StaticKVDecoder._weights
    monkeypatch.setattr(
        decoder_module.StaticKVDecoder,
        "_weights",
        lambda self, layer: dataclasses.replace(weights(self, layer), qk_norm=None),
    )


def _without_windows(monkeypatch):
    read_dims = decoder_module.read_dims

    def full_attention(model):
        dims, rope_kinds = read_dims(model)
        return dataclasses.replace(dims, windows=(None,) * len(dims.windows)), rope_kinds

    monkeypatch.setattr(decoder_module, "read_dims", full_attention)


def _without_rope_scaling(monkeypatch):
    """cos/sin of plain RoPE at the model's base, as a decoder that read only ``rope_theta`` would compute."""
    rotations = decoder_module.StaticKVDecoder.rotations
    plain = LlamaRotaryEmbedding(LlamaConfig(**COMMON, rope_parameters=dict(rope_type="default", rope_theta=1e4)))

    def unscaled(self, positions):
        self.rotary = plain
        return rotations(self, positions)

    monkeypatch.setattr(decoder_module.StaticKVDecoder, "rotations", unscaled)


@pytest.mark.parametrize(
    ("family", "switch_off"),
    [
        ("qwen3", _without_qk_norms),
        ("gemma3", _without_qk_norms),
        ("mistral-window", _without_windows),
        ("qwen2-window", _without_windows),
        ("gemma3", _without_windows),
        ("llama3", _without_rope_scaling),
        ("llama-yarn", _without_rope_scaling),
        ("llama-linear", _without_rope_scaling),
    ],
)
@pytest.mark.parametrize("greedy", [False, True])
def test_a_decoder_without_the_family_feature_is_caught(family, switch_off, greedy, monkeypatch):
    """Negative controls: the equality above fails once the decoder skips the q/k norms, attends past the window,
    or rotates with unscaled RoPE; so each feature is exercised by these configs."""
    model = _model(family)
    switch_off(monkeypatch)
    assert _apart(*_both(model, SamplingParams(NEW_TOKENS, greedy=greedy)))


REFUSED = {
    "dynamic RoPE": (
        lambda: LlamaConfig(**COMMON, rope_parameters=dict(rope_type="dynamic", factor=2.0, rope_theta=1e4)),
        "the static decoder does not implement dynamic RoPE (llama; it implements default, linear, llama3, yarn, "
        "whose frequencies do not depend on the sequence length)",
    ),
    "attention softcapping": (
        lambda: Gemma3TextConfig(**COMMON, head_dim=16, sliding_window=5, attn_logit_softcapping=50.0),
        "the static decoder does not implement attention logit softcapping (gemma3_text, 50.0)",
    ),
    "MLP bias": (
        lambda: LlamaConfig(**COMMON, mlp_bias=True),
        "the static decoder does not implement MLP biases (llama, mlp_bias=true)",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_auto_falls_back_to_hf_and_says_why(case):
    """A config the static decoder does not implement: ``auto`` decodes through HF, the run's decoder line gives
    the reason, and ``decoder=static`` and ``decode_graph`` refuse with the same reason."""
    make_config, reason = REFUSED[case]
    config = make_config()
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    auto = TorchGenerator(model, (-1,), PAD)
    assert auto.decoder == "hf"
    assert auto.describe() == f"torch backend, hf decoder ({config.model_type} model): {reason}"
    rows = auto.sample(SampleRequest(PROMPTS, SamplingParams(4), 3, torch.arange(len(PROMPTS))))
    assert int(rows.response_mask.sum()) == 4 * len(PROMPTS)
    with pytest.raises(ValueError) as static:
        TorchGenerator(model, (-1,), PAD, "static")
    assert str(static.value).startswith("policy.generation.decoder: static") and reason in str(static.value)
    with pytest.raises(ValueError) as graph:
        TorchGenerator(model, (-1,), PAD, compile=True)
    assert str(graph.value).startswith("policy.generation.decode_graph:") and reason in str(graph.value)


def test_the_choice_is_made_on_a_meta_device_model():
    """Preflight builds the policy on the meta device (no weights) and asks ``resolve_decoder``: every family
    above resolves to static there, a refused config raises its reason."""
    for family, make_config in CONFIGS.items():
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(make_config())
        assert resolve_decoder(model, "static", compile=True) == "static", family
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(REFUSED["dynamic RoPE"][0]())
    assert resolve_decoder(model, "auto") == "hf"
    with pytest.raises(ValueError, match="does not implement dynamic RoPE"):
        resolve_decoder(model, "static")


@pytest.mark.slow  # torch.compile of a decode step (~25 s on a cold cache); the eager Gemma 3 decoder: above
def test_compiled_decode_of_gemma3_matches_eager(tmp_path, monkeypatch):
    """``decode_graph`` on Gemma 3 (the family that uses every new path: two windows' masks, two RoPE kinds,
    q/k and (1 + w) norms, scaled embeddings, GELU-tanh, softcapping): the eager static decoder's tokens and
    log-probs, sampled and greedy, up to a near-tie that only rounding decides (test_generator_decode_graph.py)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # this process's kernel set
    torch._dynamo.reset()
    model = _model("gemma3")
    eager_generator = TorchGenerator(model, (-1,), PAD)
    graph_generator = TorchGenerator(model, (-1,), PAD, compile=True)
    for params in (SamplingParams(NEW_TOKENS), SamplingParams(NEW_TOKENS, greedy=True)):
        request = SampleRequest(PROMPTS, params, 3, torch.arange(len(PROMPTS)))
        eager, graph = eager_generator.sample(request), graph_generator.sample(request)
        for row, prompt in enumerate(PROMPTS):
            _same_or_a_tie(model, eager, graph, row, len(prompt), params, 3)


@pytest.mark.parametrize("family", ["qwen3", "mistral-window", "gemma3"])
def test_hf_decoding_through_dtppos_kernel_matches_sdpa(family):
    """The HF decoder on a model built with dtppo's attention (as ``build_causal_lm`` builds it): its prefill
    attends each left-padded prompt as one causal sequence, no mask; the same tokens and log-probs as SDPA's."""
    model = _model(family)
    request = SampleRequest(PROMPTS, SamplingParams(NEW_TOKENS), 11, torch.arange(len(PROMPTS)))
    sdpa = TorchGenerator(model, (-1,), PAD, "hf").sample(request)
    model.set_attn_implementation(KERNEL)
    ours = TorchGenerator(model, (-1,), PAD, "hf").sample(request)
    assert torch.equal(ours.input_ids, sdpa.input_ids)
    assert float((ours.gen_logprobs - sdpa.gen_logprobs).abs().max()) < 1e-5


@pytest.mark.parametrize("decoder", ["static", "hf"])
def test_a_long_prompts_prefill_makes_no_width_squared_tensor(decoder):
    """A 600-column left-padded prompt batch: no op of either decoder's prefill returns a tensor of W² elements
    (the [B, 1, W, W] mask it used to build); the control, SDPA's masked prefill, does."""
    model = _model("gemma3")
    model.set_attn_implementation(KERNEL)
    width = 600  # W² = 360,000 > the MLP's [B·W, 2·intermediate] (2·600·256 = 307,200)
    prompts = [[2 + i % 90 for i in range(width)], [2 + i % 90 for i in range(width // 3)]]
    request = SampleRequest(prompts, SamplingParams(1), 0, torch.arange(2))
    with _LargestTensor() as seen:
        TorchGenerator(model, (-1,), PAD, decoder).sample(request)
    assert seen.most < width * width
    model.set_attn_implementation("sdpa")
    with _LargestTensor() as dense:
        TorchGenerator(model, (-1,), PAD, "hf").sample(request)
    assert dense.most >= width * width
