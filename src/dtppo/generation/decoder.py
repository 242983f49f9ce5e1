"""Next-token logits for the sampler: a static-KV-cache decoder for Qwen2/Llama-shaped models, and a generic
fallback that calls the HF model with its own cache.

Why a decoder of our own: at rollout sizes a decode step is a few small matmuls, and the HF forward spends as
long again on Python, per-module dispatch, mask building and cache bookkeeping. ``StaticKVDecoder`` reads the
HF model's weights (q/k/v and gate/up stacked once per ``generate`` call, since the policy trains between
calls), preallocates the KV cache for the whole rollout, precomputes the rotary factors, and runs about a
dozen kernels per layer per token. The math is the HF model's, in the same precision; the unit tests compare
generation log-probs with a full HF forward.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel

_STATIC_MODEL_TYPES = ("qwen2", "llama")


@dataclass(frozen=True)
class _Dims:
    n_q: int  # query heads
    n_kv: int  # key/value heads
    head_dim: int
    eps: float  # RMSNorm epsilon


@dataclass(frozen=True)
class _LayerWeights:
    ln1: torch.Tensor  # [H]
    qkv: torch.Tensor  # [(Hq + 2·Hkv)·D, H]: q, k, v stacked; q and k rows in interleaved-RoPE order
    qkv_bias: torch.Tensor | None
    o: torch.Tensor  # [H, Hq·D]
    o_bias: torch.Tensor | None
    ln2: torch.Tensor  # [H]
    gate_up: torch.Tensor  # [2·I, H]: gate, up stacked
    down: torch.Tensor  # [H, I]


def static_decoder_supported(model: PreTrainedModel) -> bool:
    """True for plain Qwen2/Llama decoders: full attention, default RoPE, SiLU MLP without bias, no q/k norms."""
    config, inner = model.config, getattr(model, "model", None)
    if config.model_type not in _STATIC_MODEL_TYPES or inner is None or not hasattr(inner, "layers"):
        return False
    rope_type = getattr(getattr(inner, "rotary_emb", None), "rope_type", None)
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    return (
        rope_type == "default"
        and set(layer_types) == {"full_attention"}
        and getattr(config, "hidden_act", "silu") == "silu"
        and not getattr(config, "mlp_bias", False)
        and not hasattr(inner.layers[0].self_attn, "q_norm")
    )


def _interleave_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Reorder each head's D rows (or entries) from HF's halves layout [0..D/2 | D/2..D] to pairs (j, j+D/2).

    RoPE then is one complex multiply instead of slice + negate + concatenate. Queries and keys are
    permuted alike, so every q·k dot product (and the attention output, which uses unpermuted values) is
    unchanged. x: [num_heads·D, ...] -> same shape.
    """
    head_dim = x.shape[0] // num_heads
    heads = x.reshape(num_heads, 2, head_dim // 2, *x.shape[1:])
    return heads.transpose(1, 2).reshape(x.shape)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's Qwen2/Llama RMSNorm, op for op (normalise in fp32, scale in the model dtype)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def _rope(qk: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved q/k heads. qk: [N, heads, D]; rotation: [N, 1, D/2, 2] float32 (cos, sin) -> [N, heads, D].

    Eager: one complex multiply. Compiled: the same product in real arithmetic, because inductor does not
    generate code for complex ops (it would fall back to eager kernels) but fuses this into one loop."""
    pairs = qk.float().reshape(*qk.shape[:-1], -1, 2)
    if torch.compiler.is_compiling():
        a, b = pairs.unbind(-1)
        c, s = rotation.unbind(-1)
        return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2).to(qk.dtype)
    rotated = torch.view_as_complex(pairs) * torch.view_as_complex(rotation)
    return torch.view_as_real(rotated).flatten(-2).to(qk.dtype)


def _attend_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, bias: torch.Tensor, keys: int, d: _Dims
) -> torch.Tensor:
    """One query per row against the first ``keys`` cache columns. q: [B, Hq, D]; bias: [B·Hkv, Hq/Hkv, keys]
    (0 or -inf). Returns [B, Hq·D]. Grouped heads become the rows of one small matmul per (row, kv head), which
    beats SDPA's kernels for a single query on CPU."""
    batch, group = q.shape[0], d.n_q // d.n_kv
    k = k_cache[:, :, :keys].reshape(batch * d.n_kv, keys, d.head_dim)
    v = v_cache[:, :, :keys].reshape(batch * d.n_kv, keys, d.head_dim)
    scores = torch.baddbmm(
        bias, q.reshape(batch * d.n_kv, group, d.head_dim), k.transpose(1, 2), alpha=d.head_dim**-0.5
    )
    return torch.bmm(scores.softmax(-1, dtype=torch.float32).to(v.dtype), v).view(batch, d.n_q * d.head_dim)


def _layer(
    x: torch.Tensor,
    w: _LayerWeights,
    rotation: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    columns: torch.Tensor,
    keys: int,
    mask: torch.Tensor,
    d: _Dims,
) -> torch.Tensor:
    """One decoder layer. x: [B, S, H]; writes this chunk's K/V into the caches at ``columns`` [S].

    rotation: [B·S, 1, D/2, 2] (cos, sin); k_cache, v_cache: [B, Hkv, T_max, D]. S == 1 (decode): ``mask`` is the
    additive bias of ``_attend_decode``. S > 1 (prefill): ``mask`` [B, 1, S, keys] bool for SDPA.
    """
    batch, seq, hidden = x.shape
    flat = x.reshape(batch * seq, hidden)
    qkv = F.linear(_rms_norm(flat, w.ln1, d.eps), w.qkv, w.qkv_bias).view(batch * seq, -1, d.head_dim)
    qk = _rope(qkv[:, : d.n_q + d.n_kv], rotation).view(batch, seq, -1, d.head_dim)
    v = qkv[:, d.n_q + d.n_kv :].view(batch, seq, d.n_kv, d.head_dim)
    k_cache.index_copy_(2, columns, qk[:, :, d.n_q :].transpose(1, 2))
    v_cache.index_copy_(2, columns, v.transpose(1, 2))
    if seq == 1:
        attn = _attend_decode(qk[:, 0, : d.n_q], k_cache, v_cache, mask, keys, d)
    else:
        out = F.scaled_dot_product_attention(
            qk[:, :, : d.n_q].transpose(1, 2),
            k_cache[:, :, :keys],
            v_cache[:, :, :keys],
            attn_mask=mask,
            scale=d.head_dim**-0.5,
            enable_gqa=d.n_q != d.n_kv,
        )
        attn = out.transpose(1, 2).reshape(batch * seq, d.n_q * d.head_dim)
    flat = flat + F.linear(attn, w.o, w.o_bias)
    gate, up = F.linear(_rms_norm(flat, w.ln2, d.eps), w.gate_up).chunk(2, dim=-1)
    return torch.addmm(flat, F.silu(gate) * up, w.down.t()).view(batch, seq, hidden)


def _forward(
    ids: torch.Tensor,
    embed: torch.Tensor,
    layers: list[_LayerWeights],
    caches: list[torch.Tensor],
    final_norm: torch.Tensor,
    lm_head: torch.Tensor,
    rotation: torch.Tensor,
    columns: torch.Tensor,
    keys: int,
    mask: torch.Tensor,
    d: _Dims,
) -> torch.Tensor:
    """Logits of the last position of ``ids`` [B, S]: [B, V] float32. Other arguments as in ``_layer``."""
    x = F.embedding(ids, embed)
    for i, w in enumerate(layers):
        x = _layer(x, w, rotation, caches[2 * i], caches[2 * i + 1], columns, keys, mask, d)
    return F.linear(_rms_norm(x[:, -1], final_norm, d.eps), lm_head).float()


_compiled_forwards: dict[bool, object] = {}


def _compiled(cuda: bool):
    """``_forward`` under torch.compile, built once per process and device kind (dynamo then caches one graph per
    shape).

    CUDA: mode ``reduce-overhead``, so inductor records each graph as a CUDA graph and replays it, one launch per
    decode step. CPU: the default mode, inductor's fused kernels; there are no graphs to record, and
    ``reduce-overhead`` with static-address inputs gave NaN logits on CPU (torch 2.13, AVX2 kernels, 2 threads)."""
    if cuda not in _compiled_forwards:
        mode = "reduce-overhead" if cuda else None
        _compiled_forwards[cuda] = torch.compile(_forward, mode=mode, dynamic=False, fullgraph=True)
    return _compiled_forwards[cuda]


class StaticKVDecoder:
    """Prefill + per-token decode over a preallocated cache of ``max_len`` columns for ``batch`` rows.

    Column j of the cache holds the token at column j of ``[left-padded prompt | response]``; ``key_mask``
    [B, T_max] marks the columns each row may attend to (its prompt tokens and its responses so far).
    ``compile=True`` runs decode steps under torch.compile; a step then attends over all ``max_len`` columns
    (masked) so that every step has the same shapes and one graph serves them all. On CUDA the steps replay CUDA
    graphs, and the caches and the stacked weights are marked as static addresses: a graph then reads and writes
    them in place, where it would otherwise copy every input into its own buffers at each replay.
    """

    def __init__(self, model: PreTrainedModel, batch: int, max_len: int, compile: bool = False):
        cfg, inner = model.config, model.model
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.dims = _Dims(cfg.num_attention_heads, cfg.num_key_value_heads, head_dim, cfg.rms_norm_eps)
        self.layers = [self._weights(layer) for layer in inner.layers]
        self.embed, self.final_norm, self.lm_head = inner.embed_tokens.weight, inner.norm.weight, model.lm_head.weight
        self.model = model
        shape = (batch, cfg.num_key_value_heads, max_len, head_dim)
        self.caches = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(2 * len(self.layers))]
        self.key_mask = torch.zeros((batch, max_len), dtype=torch.bool, device=self.device)
        self.rotary = inner.rotary_emb
        self.max_len, self.compile = max_len, compile
        self.width, self.step_rotations = 0, torch.empty(0)  # set by ``start``, per rollout
        self.forward = _compiled(self.device.type == "cuda") if compile else _forward
        self.graphs = compile and self.device.type == "cuda"
        if self.graphs:
            for tensor in self._graph_inputs():
                torch._dynamo.mark_static_address(tensor)

    def refresh(self) -> None:
        """Copy the model's current weights into this decoder's own tensors, in place, and forget the previous
        rollout's cache columns: a decoder kept across rollouts keeps every address its graphs recorded."""
        inner = self.model.model
        for mine, layer in zip(self.layers, inner.layers):
            for name, current in vars(self._weights(layer)).items():
                if current is not None:
                    getattr(mine, name).copy_(current)
        # The model's own tensors, normally updated in place; one that was replaced is copied into the old storage.
        for mine, current in [
            (self.embed, inner.embed_tokens.weight),
            (self.final_norm, inner.norm.weight),
            (self.lm_head, self.model.lm_head.weight),
        ]:
            if mine is not current:
                mine.detach().copy_(current)
        self.key_mask.zero_()

    def _graph_inputs(self) -> list[torch.Tensor]:
        """The tensors every decode step reads (weights) or updates in place (caches)."""
        weights = [t for w in self.layers for t in vars(w).values() if t is not None]
        return [*weights, *self.caches, self.embed, self.final_norm, self.lm_head]

    def _weights(self, layer) -> _LayerWeights:
        attn, mlp, d = layer.self_attn, layer.mlp, self.dims
        q_rows = _interleave_heads(attn.q_proj.weight, d.n_q)
        k_rows = _interleave_heads(attn.k_proj.weight, d.n_kv)
        bias = None
        if attn.q_proj.bias is not None:
            bias = torch.cat(
                [
                    _interleave_heads(attn.q_proj.bias, d.n_q),
                    _interleave_heads(attn.k_proj.bias, d.n_kv),
                    attn.v_proj.bias,
                ]
            )
        return _LayerWeights(
            ln1=layer.input_layernorm.weight,
            qkv=torch.cat([q_rows, k_rows, attn.v_proj.weight]),
            qkv_bias=bias,
            o=attn.o_proj.weight,
            o_bias=attn.o_proj.bias,
            ln2=layer.post_attention_layernorm.weight,
            gate_up=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
            down=mlp.down_proj.weight,
        )

    def rotations(self, positions: torch.Tensor) -> torch.Tensor:
        """RoPE factors (cos θ, sin θ) for ``positions`` [B, S] -> [B, S, 1, D/2, 2] float32, from the model's
        rotary module."""
        cos, sin = self.rotary(self.embed[:1], positions)
        half = cos.shape[-1] // 2
        return torch.stack([cos[..., :half].float(), sin[..., :half].float()], dim=-1)[:, :, None]

    def start(
        self,
        ids: torch.Tensor,
        attention_mask: torch.Tensor,
        positions: torch.Tensor,
        prompt_lengths: torch.Tensor,
        max_new: int,
    ) -> torch.Tensor:
        """Prefill the left-padded prompts ``ids``, ``attention_mask``, ``positions`` [B, W] (``prompt_lengths``
        [B]) for a rollout of up to ``max_new`` tokens; returns the first next-token logits [B, V]."""
        self.width = ids.shape[1]
        self.step_rotations = self.rotations(prompt_lengths[:, None] + torch.arange(max_new, device=ids.device)[None])
        return self.prefill(ids, attention_mask, positions)

    def step(self, tokens: torch.Tensor, t: int) -> torch.Tensor:
        """Feed the ``t``-th response token of each row, tokens [B]; returns the next logits [B, V]."""
        return self.decode(tokens, self.width + t, self.step_rotations[:, t])

    def prefill(self, ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Left-padded prompts ``ids``, ``attention_mask``, ``positions`` [B, W] -> next-token logits [B, V]."""
        batch, width = ids.shape
        self.key_mask[:, :width] = attention_mask.bool()
        causal = torch.ones((width, width), dtype=torch.bool, device=self.device).tril()
        # A pad query may see only itself: a row with no visible key would give NaN, and NaN K/V written
        # for pad columns would poison later steps (0 weight × NaN value is still NaN).
        mask = (causal & self.key_mask[:, None, :width]) | torch.eye(width, dtype=torch.bool, device=self.device)
        rotation = self.rotations(positions).reshape(batch * width, 1, -1, 2)
        columns = torch.arange(width, device=self.device)
        return _forward(
            ids,
            self.embed,
            self.layers,
            self.caches,
            self.final_norm,
            self.lm_head,
            rotation,
            columns,
            width,
            mask[:, None],
            self.dims,
        )

    def decode(self, tokens: torch.Tensor, column: int, rotation: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens`` [B] at cache ``column``; rotation: [B, 1, D/2, 2]. Returns logits [B, V]."""
        self.key_mask[:, column] = True
        keys = self.max_len if self.compile else column + 1
        d = self.dims
        # One additive mask per step, shared by all layers: [B, 1, keys] -> [B·Hkv, Hq/Hkv, keys].
        bias = torch.zeros(self.key_mask.shape[0], 1, keys, dtype=self.dtype, device=self.device).masked_fill_(
            ~self.key_mask[:, None, :keys], float("-inf")
        )
        bias = bias.repeat_interleave(d.n_kv, dim=0).expand(-1, d.n_q // d.n_kv, -1)
        columns = torch.full((1,), column, dtype=torch.long, device=self.device)
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's logits have been read
        return self.forward(
            tokens[:, None],
            self.embed,
            self.layers,
            self.caches,
            self.final_norm,
            self.lm_head,
            rotation,
            columns,
            keys,
            bias,
            d,
        )


class HFCacheDecoder:
    """Any HF causal LM: the model's own forward with a ``DynamicCache``, one call per token."""

    def __init__(self, model: PreTrainedModel):
        self.model = model
        # transformers >= 5.2x names the cache argument ``cache``; earlier 5.x releases ``past_key_values``.
        name = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
        self.cache = {name: DynamicCache()}
        self.attention_mask: torch.Tensor | None = None
        self.prompt_lengths: torch.Tensor | None = None

    def start(
        self,
        ids: torch.Tensor,
        attention_mask: torch.Tensor,
        positions: torch.Tensor,
        prompt_lengths: torch.Tensor,
        max_new: int,
    ) -> torch.Tensor:
        """As ``StaticKVDecoder.start``; the cache grows as it goes."""
        self.prompt_lengths = prompt_lengths
        return self.prefill(ids, attention_mask, positions)

    def step(self, tokens: torch.Tensor, t: int) -> torch.Tensor:
        """As ``StaticKVDecoder.step``."""
        return self.decode(tokens, self.prompt_lengths + t)

    def prefill(self, ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.attention_mask = attention_mask
        out = self.model(
            input_ids=ids,
            attention_mask=attention_mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **self.cache,
        )
        return out.logits[:, -1].float()

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens, positions: [B] -> logits [B, V]."""
        ones = torch.ones_like(self.attention_mask[:, :1])
        self.attention_mask = torch.cat([self.attention_mask, ones], dim=1)
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.attention_mask,
            position_ids=positions[:, None],
            use_cache=True,
            **self.cache,
        )
        return out.logits[:, -1].float()
