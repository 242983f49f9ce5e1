"""Next-token logits for the sampler: a static-KV-cache decoder for the model families of
``generation.decoder_weights`` (Qwen2, Qwen3, Llama, Mistral, Gemma 3 text), and a generic fallback that calls the
HF model with its own cache.

Why a decoder of our own: at rollout sizes a decode step is a few small matmuls, and the HF forward spends as
long again on Python, per-module dispatch, mask building and cache bookkeeping. ``StaticKVDecoder`` reads the
HF model's weights (q/k/v and gate/up stacked once per ``generate`` call, since the policy trains between
calls), preallocates the KV cache for the whole rollout, precomputes the rotary factors, and runs about a
dozen kernels per layer per token. The math is the HF model's, in the same precision; the unit tests compare
generation log-probs with a full HF forward.

Sliding-window layers keep every column in the cache and mask the keys older than their window, as HF's masks
do (a query at column i sees keys j with i - j < window); layers of one window share one mask per step.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel

from dtppo.generation.decoder_weights import _Dims, _LayerWeights, read_dims, read_layer, read_top
from dtppo.models.attention import KERNEL, Segments, attend_segments


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, d: _Dims) -> torch.Tensor:
    """HF's RMSNorm, op for op: normalise in fp32, then Llama's ``w · x̂`` in the model dtype, or Gemma's
    ``x̂ · (1 + w)`` in fp32 (``weight`` is then 1 + w, fp32) cast to the model dtype. x: [..., N]; weight: [N] or
    broadcastable to x's trailing dims."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + d.eps)
    if d.offset_norms:
        return (x32 * weight).to(x.dtype)
    return weight * x32.to(x.dtype)


def _act(x: torch.Tensor, d: _Dims) -> torch.Tensor:
    """The MLP's activation of the gate projection x: [N, I] -> [N, I] (HF's gelu_pytorch_tanh is this call)."""
    return F.silu(x) if d.act == "silu" else F.gelu(x, approximate="tanh")


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
    beats SDPA's kernels for a single query on CPU. The scores are computed in fp32, as the trainer's attention
    kernels keep them (a no-op cast for fp32 models): bf16 scores are rounded by 0.125 at |score| 16."""
    batch, group = q.shape[0], d.n_q // d.n_kv
    k = k_cache[:, :, :keys].reshape(batch * d.n_kv, keys, d.head_dim).float()
    v = v_cache[:, :, :keys].reshape(batch * d.n_kv, keys, d.head_dim)
    queries = q.reshape(batch * d.n_kv, group, d.head_dim).float()
    scores = torch.baddbmm(bias.float(), queries, k.transpose(1, 2), alpha=d.scale)
    return torch.bmm(scores.softmax(-1, dtype=torch.float32).to(v.dtype), v).view(batch, d.n_q * d.head_dim)


def _layer(
    x: torch.Tensor,
    w: _LayerWeights,
    rotation: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    columns: torch.Tensor,
    keys: int,
    mask: torch.Tensor | tuple[Segments, int | None],
    d: _Dims,
) -> torch.Tensor:
    """One decoder layer. x: [B, S, H]; writes this chunk's K/V into the caches at ``columns`` [S].

    rotation: [B·S, 1, D/2, 2] (cos, sin); k_cache, v_cache: [B, Hkv, T_max, D]. S == 1 (decode): ``mask`` is the
    additive bias of ``_attend_decode``. S > 1 (prefill): ``mask`` is the prompts' ``Segments`` and the layer's
    window, for ``attend_segments``.
    """
    batch, seq, hidden = x.shape
    flat = x.reshape(batch * seq, hidden)
    qkv = F.linear(_rms_norm(flat, w.ln1, d), w.qkv, w.qkv_bias).view(batch * seq, -1, d.head_dim)
    qk = qkv[:, : d.n_q + d.n_kv]
    if w.qk_norm is not None:  # Qwen3, Gemma 3: per-head RMSNorm of q and k, before RoPE
        qk = _rms_norm(qk, w.qk_norm, d)
    qk = _rope(qk, rotation).view(batch, seq, -1, d.head_dim)
    v = qkv[:, d.n_q + d.n_kv :].view(batch, seq, d.n_kv, d.head_dim)
    k_cache.index_copy_(2, columns, qk[:, :, d.n_q :].transpose(1, 2))
    v_cache.index_copy_(2, columns, v.transpose(1, 2))
    if seq == 1:
        attn = _attend_decode(qk[:, 0, : d.n_q], k_cache, v_cache, mask, keys, d)
    else:
        segments, window = mask
        q = qk[:, :, : d.n_q].transpose(1, 2)
        out = attend_segments(q, k_cache[:, :, :keys], v_cache[:, :, :keys], segments, window, d.scale)
        attn = out.reshape(batch * seq, d.n_q * d.head_dim)
    attn = F.linear(attn, w.o, w.o_bias)
    if w.attn_out_norm is not None:  # Gemma: normed before the residual add
        attn = _rms_norm(attn, w.attn_out_norm, d)
    flat = flat + attn
    gate, up = F.linear(_rms_norm(flat, w.ln2, d), w.gate_up).chunk(2, dim=-1)
    if w.mlp_out_norm is None:
        return torch.addmm(flat, _act(gate, d) * up, w.down.t()).view(batch, seq, hidden)
    return (flat + _rms_norm(F.linear(_act(gate, d) * up, w.down), w.mlp_out_norm, d)).view(batch, seq, hidden)


def _forward(
    ids: torch.Tensor,
    embed: torch.Tensor,
    embed_scale: torch.Tensor | None,
    layers: list[_LayerWeights],
    caches: list[torch.Tensor],
    final_norm: torch.Tensor,
    lm_head: torch.Tensor,
    rotation: torch.Tensor,
    columns: torch.Tensor,
    keys: int,
    masks: list,
    d: _Dims,
) -> torch.Tensor:
    """Logits of the last position of ``ids`` [B, S]: [B, V] float32. rotation: [B·S, K, D/2, 2], one (cos, sin)
    per RoPE kind (``d.rope_of_layer``); masks: one per window (``d.mask_of_layer``), each as ``_layer``'s mask;
    embed_scale: a 0-d tensor (Gemma's sqrt(H) in the model dtype) or None. Other arguments as in ``_layer``."""
    x = F.embedding(ids, embed)
    if embed_scale is not None:
        x = x * embed_scale
    for i, w in enumerate(layers):
        r, m = d.rope_of_layer[i], d.mask_of_layer[i]
        x = _layer(x, w, rotation[:, r : r + 1], caches[2 * i], caches[2 * i + 1], columns, keys, masks[m], d)
    # fp32 head, as the trainer's (models.logprobs): logits rounded to bf16 would move every log-prob.
    logits = F.linear(_rms_norm(x[:, -1], final_norm, d).float(), lm_head.float())
    if d.final_softcap is not None:
        logits = torch.tanh(logits / d.final_softcap) * d.final_softcap
    return logits


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
        self.dims, self.rope_kinds = read_dims(model)
        self.layers = [self._weights(layer) for layer in inner.layers]
        self.embed, self.embed_scale, self.final_norm, self.lm_head = read_top(model, self.dims)
        self.model = model
        shape = (batch, cfg.num_key_value_heads, max_len, self.dims.head_dim)
        self.caches = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(2 * len(self.layers))]
        self.key_mask = torch.zeros((batch, max_len), dtype=torch.bool, device=self.device)
        self.rotary = inner.rotary_emb
        self.max_len, self.compile = max_len, compile
        self.width, self.step_rotations = 0, torch.empty(0)  # set by ``start``, per rollout
        self.forward = _compiled(self.device.type == "cuda") if compile else _forward
        self.graphs = compile and self.device.type == "cuda"
        if self.graphs:
            for tensor in self._graph_inputs():
                # guard=False (explicit: older torch guarded by default): a decoder rebuilt at new addresses reuses
                # the compiled code instead of counting as one more recompile.
                torch._dynamo.mark_static_address(tensor, guard=False)

    def refresh(self) -> None:
        """Copy the model's current weights into this decoder's own tensors, in place, and forget the previous
        rollout's cache columns: a decoder kept across rollouts keeps every address its graphs recorded."""
        for mine, layer in zip(self.layers, self.model.model.layers):
            for name, current in vars(self._weights(layer)).items():
                if current is not None:
                    getattr(mine, name).copy_(current)
        # The model's own tensors, normally updated in place; one that was replaced (or is derived, as Gemma's
        # 1 + w) is copied into the old storage.
        embed, _, final_norm, lm_head = read_top(self.model, self.dims)
        for mine, current in [(self.embed, embed), (self.final_norm, final_norm), (self.lm_head, lm_head)]:
            if mine is not current:
                mine.detach().copy_(current)
        self.key_mask.zero_()

    def _graph_inputs(self) -> list[torch.Tensor]:
        """The tensors every decode step reads (weights) or updates in place (caches)."""
        weights = [t for w in self.layers for t in vars(w).values() if t is not None]
        scale = [] if self.embed_scale is None else [self.embed_scale]
        return [*weights, *self.caches, self.embed, *scale, self.final_norm, self.lm_head]

    def _weights(self, layer) -> _LayerWeights:
        return read_layer(layer, self.dims)

    def rotations(self, positions: torch.Tensor) -> torch.Tensor:
        """RoPE factors (cos θ, sin θ) for ``positions`` [B, S] -> [B, S, K, D/2, 2] float32, from the model's
        rotary module: one per RoPE kind (K = 1, or Gemma 3's one per layer type)."""
        per_kind = []
        for layer_type in self.rope_kinds:
            extra = () if layer_type is None else (layer_type,)
            cos, sin = self.rotary(self.embed[:1], positions, *extra)
            half = cos.shape[-1] // 2
            per_kind.append(torch.stack([cos[..., :half].float(), sin[..., :half].float()], dim=-1))
        return torch.stack(per_kind, dim=2)

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
        columns = torch.arange(width, device=self.device)
        # Each prompt is a causal sequence at its row's end, attended without a [W, W] mask; the pad columns
        # before it get a zero output (finite: their K/V, never attended, must not be NaN).
        segments = Segments.of_left_padded(attention_mask)
        masks = [(segments, window) for window in self.dims.windows]
        rotation = self.rotations(positions).flatten(0, 1)
        return _forward(
            ids,
            self.embed,
            self.embed_scale,
            self.layers,
            self.caches,
            self.final_norm,
            self.lm_head,
            rotation,
            columns,
            width,
            masks,
            self.dims,
        )

    def decode(self, tokens: torch.Tensor, column: int, rotation: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens`` [B] at cache ``column``; rotation: [B, K, D/2, 2]. Returns logits [B, V]."""
        self.key_mask[:, column] = True
        keys = self.max_len if self.compile else column + 1
        d = self.dims
        # One additive mask per window per step, shared by its layers: [B, 1, keys] -> [B·Hkv, Hq/Hkv, keys].
        biases = []
        for window in d.windows:
            seen = self.key_mask[:, None, :keys]
            if window is not None:
                seen = seen & (torch.arange(keys, device=self.device) > column - window)
            bias = torch.zeros(seen.shape, dtype=self.dtype, device=self.device).masked_fill_(~seen, float("-inf"))
            biases.append(bias.repeat_interleave(d.n_kv, dim=0).expand(-1, d.n_q // d.n_kv, -1))
        columns = torch.full((1,), column, dtype=torch.long, device=self.device)
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's logits have been read
        return self.forward(
            tokens[:, None],
            self.embed,
            self.embed_scale,
            self.layers,
            self.caches,
            self.final_norm,
            self.lm_head,
            rotation,
            columns,
            keys,
            biases,
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
        # With dtppo's kernel the prompts are causal sequences at their rows' ends, attended without a [W, W] mask;
        # the decode steps' masks are [B, 1, 1, keys].
        if self.model.config._attn_implementation == KERNEL:
            inputs = {"dtppo_segments": Segments.of_left_padded(attention_mask)}
        else:
            inputs = {"attention_mask": attention_mask}
        out = self.model(
            input_ids=ids,
            **inputs,
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
