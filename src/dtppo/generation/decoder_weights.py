"""What the static-KV decoder (``generation.decoder``) reads from an HF model: whether it implements the model's
architecture (and if not, why, in one phrase), the shape of its computation, and its weights, per family.

Families: Qwen2 and Llama (plain blocks), Qwen3 (per-head q/k RMSNorm before RoPE, an explicit ``head_dim``),
Mistral (a Llama block, optionally one sliding window for every layer) and Gemma 3 text (sliding and global layers
with their own RoPE, q/k norms, ``x·(1 + w)`` RMSNorms, norms after attention and after the MLP, scaled embeddings,
GELU-tanh, ``query_pre_attn_scalar``, final logit softcapping). Everything here reads structure only (config and
module attributes), so it also works on a meta-device model (preflight's decoder check).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

# model_type -> how its RMSNorms scale: "weight" (w · x̂, Llama) or "offset" ((1 + w) · x̂ in fp32, Gemma).
_FAMILIES = {"qwen2": "weight", "llama": "weight", "qwen3": "weight", "mistral": "weight", "gemma3_text": "offset"}
_FAMILY_NAMES = "Qwen2, Qwen3, Llama, Mistral and Gemma 3 text"
# RoPE types whose frequencies are fixed at load: HF's rotary module then gives, for any position, the cos/sin
# (attention scaling folded in) that the static decoder precomputes for the whole rollout. "dynamic" and
# "longrope" change their frequencies with the longest position of each call, so a rollout precomputed at once
# would rotate differently from HF's step-by-step calls.
_STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
_LAYER_TYPES = ("full_attention", "sliding_attention")
_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


@dataclass(frozen=True)
class _Dims:
    """The shape of the computation, fixed per model (a constant to torch.compile)."""

    n_q: int  # query heads
    n_kv: int  # key/value heads
    head_dim: int
    eps: float  # RMSNorm epsilon
    scale: float  # attention logit scale: head_dim^-0.5, or query_pre_attn_scalar^-0.5 (Gemma)
    offset_norms: bool  # Gemma's RMSNorm: (x̂ · (1 + w)) in fp32, then the model dtype
    act: str  # MLP activation: "silu" or "gelu_pytorch_tanh"
    final_softcap: float | None  # logits -> cap · tanh(logits / cap), Gemma's final_logit_softcapping
    rope_of_layer: tuple[int, ...]  # per layer: which of the rotations (RoPE kinds) it uses
    mask_of_layer: tuple[int, ...]  # per layer: which entry of ``windows`` it attends with
    windows: tuple[int | None, ...]  # per mask kind: the sliding window in tokens, None for full causal attention


@dataclass(frozen=True)
class _LayerWeights:
    ln1: torch.Tensor  # [H]: the norm before attention
    qkv: torch.Tensor  # [(Hq + 2·Hkv)·D, H]: q, k, v stacked; q and k rows in interleaved-RoPE order
    qkv_bias: torch.Tensor | None
    o: torch.Tensor  # [H, Hq·D]
    o_bias: torch.Tensor | None
    ln2: torch.Tensor  # [H]: the norm before the MLP (Llama's post_attention_layernorm, Gemma's pre_feedforward)
    gate_up: torch.Tensor  # [2·I, H]: gate, up stacked
    down: torch.Tensor  # [H, I]
    qk_norm: torch.Tensor | None = None  # [Hq + Hkv, D]: q_norm's weight per query head, then k_norm's per key head
    attn_out_norm: torch.Tensor | None = None  # [H]: Gemma's post_attention_layernorm, on the attention output
    mlp_out_norm: torch.Tensor | None = None  # [H]: Gemma's post_feedforward_layernorm, on the MLP output


def static_decoder_refusal(model: PreTrainedModel) -> str | None:
    """None where the static decoder implements ``model``'s architecture; else why not, one phrase (the line the
    run prints about its decoder and ``policy.generation.decoder=static``'s error both quote it)."""
    config, inner = model.config, getattr(model, "model", None)
    family = config.model_type
    if family not in _FAMILIES or inner is None or not hasattr(inner, "layers"):
        return f"the static decoder implements {_FAMILY_NAMES} models, not this {family} model"
    rope_types = _rope_types(inner)
    if not rope_types:
        return f"the static decoder found no rotary module on this {family} model"
    if unknown := sorted(set(rope_types.values()) - set(_STATIC_ROPE_TYPES)):
        return (
            f"the static decoder does not implement {unknown[0]} RoPE ({family}; it implements "
            f"{', '.join(_STATIC_ROPE_TYPES)}, whose frequencies do not depend on the sequence length)"
        )
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    if unknown := sorted(set(layer_types) - set(_LAYER_TYPES)):
        return f"the static decoder does not implement {unknown[0]} layers ({family})"
    if (act := _activation(config)) not in _ACTIVATIONS:
        return f"the static decoder does not implement the {act} activation ({family})"
    if getattr(config, "mlp_bias", False):
        return f"the static decoder does not implement MLP biases ({family}, mlp_bias=true)"
    if (cap := getattr(config, "attn_logit_softcapping", None)) is not None:
        # HF's SDPA attention (what dtppo loads) ignores it and its eager attention applies it: no one answer.
        return f"the static decoder does not implement attention logit softcapping ({family}, {cap})"
    if getattr(config, "use_bidirectional_attention", False):
        return f"the static decoder does not implement bidirectional attention ({family})"
    if any(w is not None and w < 1 for w in _layer_windows(model)):
        return f"the static decoder needs a positive sliding window ({family}, {config.sliding_window})"
    return None


def _rope_types(inner) -> dict[str | None, str]:
    """The rotary module's RoPE type per layer type (Gemma 3: one per type) or for all layers (key None)."""
    rope_type = getattr(getattr(inner, "rotary_emb", None), "rope_type", None)
    if isinstance(rope_type, dict):
        return dict(rope_type)
    return {} if rope_type is None else {None: rope_type}


def _activation(config) -> str:
    return getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")


def _layer_windows(model: PreTrainedModel) -> list[int | None]:
    """Each layer's sliding window (None: full causal attention), as HF's attention passes it to its mask: Mistral's
    config window for every layer; Qwen2/Qwen3/Gemma 3 keep it on the attention modules of sliding layers."""
    config, layers = model.config, model.model.layers
    if config.model_type == "mistral":
        return [config.sliding_window] * len(layers)
    return [getattr(layer.self_attn, "sliding_window", None) for layer in layers]


def read_dims(model: PreTrainedModel) -> tuple[_Dims, list[str | None]]:
    """The decoder's ``_Dims`` for ``model`` and the layer type each rotation kind is computed for (None: the
    rotary module takes no layer type)."""
    cfg, layers = model.config, model.model.layers
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope_kinds = list(_rope_types(model.model))
    if rope_kinds == [None]:
        rope_of_layer = (0,) * len(layers)
    else:
        rope_of_layer = tuple(rope_kinds.index(t) for t in cfg.layer_types[: len(layers)])
    per_layer = _layer_windows(model)
    windows = tuple(dict.fromkeys(per_layer))
    dims = _Dims(
        n_q=cfg.num_attention_heads,
        n_kv=cfg.num_key_value_heads,
        head_dim=head_dim,
        eps=cfg.rms_norm_eps,
        scale=layers[0].self_attn.scaling,
        offset_norms=_FAMILIES[cfg.model_type] == "offset",
        act=_activation(cfg),
        final_softcap=getattr(cfg, "final_logit_softcapping", None),
        rope_of_layer=rope_of_layer,
        mask_of_layer=tuple(windows.index(w) for w in per_layer),
        windows=windows,
    )
    return dims, rope_kinds


def norm_weight(weight: torch.Tensor, d: _Dims) -> torch.Tensor:
    """An RMSNorm's weight [N] as ``decoder._rms_norm`` takes it: as is, or Gemma's 1 + w in fp32 (HF adds in
    fp32) -> [N]."""
    return 1.0 + weight.float() if d.offset_norms else weight


def interleave_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Reorder each head's D rows (or entries) from HF's halves layout [0..D/2 | D/2..D] to pairs (j, j+D/2).

    RoPE then is one complex multiply instead of slice + negate + concatenate. Queries and keys are
    permuted alike, so every q·k dot product (and the attention output, which uses unpermuted values) is
    unchanged. x: [num_heads·D, ...] -> same shape.
    """
    head_dim = x.shape[0] // num_heads
    heads = x.reshape(num_heads, 2, head_dim // 2, *x.shape[1:])
    return heads.transpose(1, 2).reshape(x.shape)


def read_layer(layer, d: _Dims) -> _LayerWeights:
    """One HF decoder layer's weights in the decoder's layout (new tensors where stacked or derived, else the
    model's own)."""
    attn, mlp = layer.self_attn, layer.mlp
    bias = None
    if attn.q_proj.bias is not None:
        bias = torch.cat(
            [interleave_heads(attn.q_proj.bias, d.n_q), interleave_heads(attn.k_proj.bias, d.n_kv), attn.v_proj.bias]
        )
    qk_norm = None
    if hasattr(attn, "q_norm"):  # one weight per head dim, the same for every head: [D] -> [Hq + Hkv, D]
        q_norm = norm_weight(interleave_heads(attn.q_norm.weight, 1), d)
        k_norm = norm_weight(interleave_heads(attn.k_norm.weight, 1), d)
        qk_norm = torch.cat([q_norm.expand(d.n_q, -1), k_norm.expand(d.n_kv, -1)])
    gemma = hasattr(layer, "pre_feedforward_layernorm")
    q_rows, k_rows = interleave_heads(attn.q_proj.weight, d.n_q), interleave_heads(attn.k_proj.weight, d.n_kv)
    return _LayerWeights(
        ln1=norm_weight(layer.input_layernorm.weight, d),
        qkv=torch.cat([q_rows, k_rows, attn.v_proj.weight]),
        qkv_bias=bias,
        o=attn.o_proj.weight,
        o_bias=attn.o_proj.bias,
        ln2=norm_weight((layer.pre_feedforward_layernorm if gemma else layer.post_attention_layernorm).weight, d),
        gate_up=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
        down=mlp.down_proj.weight,
        qk_norm=qk_norm,
        attn_out_norm=norm_weight(layer.post_attention_layernorm.weight, d) if gemma else None,
        mlp_out_norm=norm_weight(layer.post_feedforward_layernorm.weight, d) if gemma else None,
    )


def read_top(model: PreTrainedModel, d: _Dims) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """The embedding [V, H], its scale (a 0-d tensor in the model dtype, Gemma's sqrt(H); None: unscaled), the
    final norm's weight [H] and the LM head [V, H]."""
    inner = model.model
    embed = inner.embed_tokens
    scale = getattr(embed, "embed_scale", None)
    if scale is not None:  # HF multiplies by the buffer cast to the weights' dtype (bf16 rounds sqrt(H))
        scale = scale.to(embed.weight.dtype)
    return embed.weight, scale, norm_weight(inner.norm.weight, d), model.lm_head.weight
