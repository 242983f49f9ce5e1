"""Attention whose memory grows linearly with the sequence, for the training forwards (log-probs, values, backward).

Why: whenever a dense mask reaches SDPA (padding, or packed rows' block-causal mask, each ``[L, L]``), torch takes a
kernel that materialises the attention weights, and memory and time grow ~4× per doubling of the length. Without a
mask, ``is_causal`` SDPA runs flash attention (CPU and CUDA), whose memory is linear. So a training forward passes
no mask at all and the sequences' boundaries instead:

- right-padded rows are causal sequences as they stand: pads only follow a row's tokens, so no real token sees one;
- packed rows (``models.packing``) carry :class:`Segments`: each sequence is gathered into a right-padded group of
  sequences of similar length (within 2× of the group's longest), attended causally, and scattered back;
- a sliding-window layer (its ``sliding_window``: a query sees keys with ``q - k < window``, as transformers'
  masks) attends in blocks of ``window`` queries, each over its own block and the one before with one shared
  ``[window, 2·window]`` band mask: memory grows with ``L · window``.

The kernel is registered in transformers' ``AttentionInterface`` as :data:`KERNEL` and chosen once, when a model
is built (:func:`attention_implementation`). Forwards that bring a padding mask or a KV cache (the HF decoder's
generation) go to transformers' own SDPA unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from dtppo.distributed.context import ContextShards

KERNEL = "dtppo_segments"


@dataclass(frozen=True)
class Segments:
    """Where the sequences of a batch of rows ``[R, L]`` lie, in groups of similar length.

    tokens: R · L, the flat token count; flat index ``r · L + t``.
    groups: per group, ``index`` [n, S] int64, the flat index of each of its n sequences' tokens in order, then
            ``tokens`` (a zero row) past a sequence's end; S is the group's longest sequence.
    """

    tokens: int
    groups: tuple[torch.Tensor, ...]

    @staticmethod
    def of_spans(spans: list[tuple[int, int]], tokens: int, device: torch.device | str = "cpu") -> Segments:
        """From each sequence's flat [start, end) among ``tokens``; no token in two spans (one in none, a pad, is
        attended by nothing).

        Grouped longest first, a group taking the spans longer than half its first's, so padding to the group's
        longest at most doubles a group's tokens (one long sequence is not padded against many short ones)."""
        order = sorted(spans, key=lambda span: span[0] - span[1])
        groups: list[list[tuple[int, int]]] = []
        for span in order:
            if not groups or 2 * (span[1] - span[0]) <= groups[-1][0][1] - groups[-1][0][0]:
                groups.append([])
            groups[-1].append(span)
        indices = []
        for group in groups:
            index = torch.full((len(group), group[0][1] - group[0][0]), tokens, dtype=torch.long)
            for n, (start, end) in enumerate(group):
                index[n, : end - start] = torch.arange(start, end)
            indices.append(index.to(device))
        return Segments(tokens, tuple(indices))

    @staticmethod
    def of_positions(position_ids: torch.Tensor) -> Segments:
        """The sequences of packed rows, each starting where ``position_ids`` [R, L] restart at 0 (and at a row's
        first token)."""
        rows, width = position_ids.shape
        starts = (position_ids == 0).clone()
        starts[:, 0] = True
        flat = starts.reshape(-1).nonzero().squeeze(-1).tolist() + [rows * width]
        spans = [(start, min(nxt, (start // width + 1) * width)) for start, nxt in zip(flat, flat[1:])]
        return Segments.of_spans(spans, rows * width, position_ids.device)

    @staticmethod
    def of_left_padded(attention_mask: torch.Tensor) -> Segments:
        """Left-padded prompts ``attention_mask`` [B, W] (1 on a prompt's tokens, all at its row's end): one
        sequence per non-empty row."""
        rows, width = attention_mask.shape
        lengths = attention_mask.sum(-1).tolist()
        spans = [((row + 1) * width - n, (row + 1) * width) for row, n in enumerate(lengths) if n]
        return Segments.of_spans(spans, rows * width, attention_mask.device)


def attention_implementation(config) -> str:
    """The attention a model built from ``config`` trains with: :data:`KERNEL`, or transformers' ``sdpa`` for
    what the kernel does not compute (logit softcapping, Gemma 2; attention chunks, Llama 4), whose masks are
    dense."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    unsupported = getattr(text, "attn_logit_softcapping", None) or getattr(text, "attention_chunk_size", None)
    return "sdpa" if unsupported else KERNEL


def context_parallel_refusal(config) -> str | None:
    """Why a model built from ``config`` cannot train context-parallel, or None: its attention must be dtppo's
    kernel (not transformers' sdpa, kept for softcapping or attention chunks) without sliding windows, which the
    context-parallel kernel does not compute."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if attention_implementation(text) != KERNEL:
        return f"{text.model_type} keeps transformers' sdpa attention (logit softcapping or attention chunks)"
    windowed = "sliding_attention" in (getattr(text, "layer_types", None) or []) or (
        text.model_type == "mistral" and getattr(text, "sliding_window", None)
    )
    if windowed:
        return f"{text.model_type} has sliding-window layers (sliding_window {text.sliding_window})"
    return None


def segment_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    dtppo_segments: Segments | None = None,
    dtppo_context: ContextRows | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature. query: [B, Hq, L, D]; key, value: [B, Hkv, L, D] -> ([B, L, Hq, D], None).

    dtppo_segments: the sequences of packed rows; None: each row is one causal sequence (right-padded rows).
    dtppo_context: a context-parallel forward (``L`` is this rank's share of each row): the rows' sequences and
    this rank's tokens among them.
    """
    if attention_mask is not None or query.shape[2] != key.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling)
    unsupported = [name for name in ("softcap", "s_aux") if kwargs.get(name) is not None]
    if unsupported:
        raise ValueError(f"{KERNEL} attention does not compute {unsupported} (attention_implementation keeps sdpa)")
    extra = {"scale": scaling, "dropout_p": dropout if module.training else 0.0}
    if dtppo_context is not None:
        if sliding_window or extra["dropout_p"]:
            raise ValueError("context-parallel attention computes neither sliding windows nor dropout")
        return attend_context(query, key, value, dtppo_context, scaling), None
    if dtppo_segments is None:
        attend = _attend_in_window if sliding_window else _attend
        return attend(query, key, value, sliding_window, **extra).transpose(1, 2).contiguous(), None
    return attend_segments(query, key, value, dtppo_segments, sliding_window, **extra), None


def attend_segments(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    segments: Segments,
    window: int | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Causal attention within each sequence of ``segments`` (a query sees keys with ``q - k < window`` too when
    ``window`` is set). query: [B, Hq, L, D]; key, value: [B, Hkv, L, D] -> [B, L, Hq, D]; 0 at a token no
    sequence holds. Each group of sequences is gathered from the flat tokens, attended, and put back."""
    attend = _attend_in_window if window else _attend
    extra = {"scale": scale, "dropout_p": dropout_p}
    batch, heads, width, dim = query.shape

    def flat(x: torch.Tensor) -> torch.Tensor:  # [B, H, L, D] -> [B·L + 1, H, D], a zero row last
        rows = x.transpose(1, 2).reshape(batch * width, x.shape[1], dim)
        return torch.cat([rows, rows.new_zeros(1, x.shape[1], dim)])

    q_flat, k_flat, v_flat = flat(query), flat(key), flat(value)
    where, results = [], []
    for index in segments.groups:
        q, k, v = (x[index].transpose(1, 2) for x in (q_flat, k_flat, v_flat))  # [n, H, S, D]
        real = index < segments.tokens
        where.append(index[real])
        results.append(attend(q, k, v, window, **extra).transpose(1, 2)[real])  # [tokens of the group, Hq, D]
    out = query.new_zeros(segments.tokens, heads, dim).index_put((torch.cat(where),), torch.cat(results))
    return out.reshape(batch, width, heads, dim)


def _attend(q, k, v, window: int | None, scale, dropout_p) -> torch.Tensor:
    """Causal attention within each row. q: [N, Hq, S, D]; k, v: [N, Hkv, S, D] -> [N, Hq, S, D]."""
    gqa = q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, dropout_p=dropout_p, enable_gqa=gqa)


def _attend_in_window(q, k, v, window: int, scale, dropout_p) -> torch.Tensor:
    """Causal attention within each row, a query seeing only keys with ``q - k < window``. Shapes as
    :func:`_attend`. The first block of ``window`` queries is plain causal; every later block attends to itself
    and the block before, under one band mask shared by all blocks and rows."""
    rows, heads, length, dim = q.shape
    if length <= window:
        return _attend(q, k, v, None, scale, dropout_p)
    first = _attend(q[:, :, :window], k[:, :, :window], v[:, :, :window], None, scale, dropout_p)
    blocks = -(-length // window)
    pad = blocks * window - length

    def blocked(x: torch.Tensor) -> torch.Tensor:  # [N, H, L, D] -> [N, H, blocks, window, D]
        return F.pad(x, (0, 0, 0, pad)).reshape(rows, x.shape[1], blocks, window, dim)

    qb, kb, vb = blocked(q)[:, :, 1:], blocked(k), blocked(v)
    keys = torch.cat([kb[:, :, :-1], kb[:, :, 1:]], dim=3)  # block b-1 then block b: [N, Hkv, blocks-1, 2w, D]
    values = torch.cat([vb[:, :, :-1], vb[:, :, 1:]], dim=3)
    i = torch.arange(window, device=q.device)[:, None]
    j = torch.arange(2 * window, device=q.device)[None]
    band = (j > i) & (j <= i + window)  # query i of block b is at b·w + i, key j at (b-1)·w + j

    def merged(x: torch.Tensor) -> torch.Tensor:  # [N, H, n, s, D] -> [N·n, H, s, D]
        return x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[3], dim)

    gqa = heads != k.shape[1]
    rest = F.scaled_dot_product_attention(
        merged(qb), merged(keys), merged(values), attn_mask=band, scale=scale, dropout_p=dropout_p, enable_gqa=gqa
    )
    rest = rest.reshape(rows, blocks - 1, heads, window, dim).transpose(1, 2).reshape(rows, heads, -1, dim)
    return torch.cat([first, rest], dim=2)[:, :, :length]


@dataclass(frozen=True)
class ContextRows:
    """A context-parallel forward's rows: this rank's tokens (``shards``) and, per chunk of them, the rows grouped by
    how that chunk cuts their sequences.

    plan: per chunk of ``shards.chunks(W)``, ``(rows [n] int64, pieces)`` for each group of rows the chunk cuts
    alike; a piece ``(first query, end, first key)`` in global token positions: queries [first query, end) of one
    sequence, which attend to its keys [first key, end) causally.
    """

    shards: ContextShards
    plan: tuple[tuple[tuple[torch.Tensor, tuple[tuple[int, int, int], ...]], ...], ...]

    @staticmethod
    def of(shards: ContextShards, starts: torch.Tensor) -> ContextRows:
        """starts: [B, W] bool, global rows (W a multiple of 2·cp), True at each sequence's first token; a row's
        first token starts one whatever it holds."""
        starts = starts.clone()
        starts[:, 0] = True
        firsts = [row.nonzero().squeeze(-1).tolist() for row in starts.cpu()]
        plan = []
        for start, end in shards.chunks(starts.shape[1]):
            groups: dict[tuple, list[int]] = {}
            for row, row_firsts in enumerate(firsts):
                groups.setdefault(_pieces(row_firsts, start, end), []).append(row)
            plan.append(tuple((torch.tensor(rows, device=starts.device), key) for key, rows in groups.items()))
        return ContextRows(shards, tuple(plan))


def _pieces(firsts: list[int], start: int, end: int) -> tuple[tuple[int, int, int], ...]:
    """The parts of the sequences starting at ``firsts`` (sorted, firsts[0] = 0) that lie in [start, end)."""
    inside = [first for first in firsts if start < first < end]
    bounds = [start, *inside, end]
    keys = [max(first for first in firsts if first <= start), *inside]
    return tuple(zip(bounds, bounds[1:], keys))


def attend_context(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, context: ContextRows, scale: float | None
) -> torch.Tensor:
    """Causal attention within each sequence for this rank's tokens of the rows, over the keys and values of all
    the group's ranks. query: [B, Hq, n, D]; key, value: [B, Hkv, n, D], n = W / cp -> [B, n, Hq, D]."""
    keys, values = context.shards.gather_keys(key), context.shards.gather_keys(value)  # [B, Hkv, W, D]
    batch, outs, offset = query.shape[0], [], 0
    for (start, end), groups in zip(context.shards.chunks(keys.shape[2]), context.plan):
        queries = query[:, :, offset : offset + end - start]
        offset += end - start
        out = query.new_zeros(queries.shape)
        for rows, pieces in groups:
            # Views of the gathered keys when a group is every row (padded rows): saved for backward, no copies.
            whole = len(rows) == batch

            def take(x: torch.Tensor, first: int, last: int) -> torch.Tensor:
                return x[:, :, first:last] if whole else x[rows, :, first:last]

            parts = [
                _BlockAttention.apply(take(queries, a - start, b - start), take(keys, k0, a), take(values, k0, a),
                                      take(keys, a, b), take(values, a, b), scale)
                for a, b, k0 in pieces
            ]  # fmt: skip
            out = torch.cat(parts, dim=2) if whole else out.index_put((rows,), torch.cat(parts, dim=2))
        outs.append(out)
    return torch.cat(outs, dim=2).transpose(1, 2)


class _BlockAttention(torch.autograd.Function):
    """Queries [N, Hq, c, D] over earlier keys [N, Hkv, p, D] (all visible) and their own block's [N, Hkv, c, D]
    (causal; grouped-query heads as torch's kernel takes them), as one softmax: the two blocks' flash-attention
    outputs merged by their log-sum-exps. The backward runs each block's flash backward with the merged output and
    log-sum-exp (each block's share of the one softmax), so no [c, p + c] tensor exists in either pass."""

    @staticmethod
    def forward(ctx, q, k_past, v_past, k_own, v_own, scale):
        out, lse = _flash(q, k_own, v_own, True, scale)
        if k_past.shape[2]:
            out_past, lse_past = _flash(q, k_past, v_past, False, scale)
            merged = torch.logaddexp(lse, lse_past)
            out = (out * (lse - merged).exp()[..., None] + out_past * (lse_past - merged).exp()[..., None]).to(q.dtype)
            lse = merged
        ctx.save_for_backward(q, k_past, v_past, k_own, v_own, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k_past, v_past, k_own, v_own, out, lse = ctx.saved_tensors
        grad = grad.contiguous()
        dq, dk_own, dv_own = _flash_backward(grad, q, k_own, v_own, out, lse, True, ctx.scale)
        if not k_past.shape[2]:
            return dq, torch.zeros_like(k_past), torch.zeros_like(v_past), dk_own, dv_own, None
        dq_past, dk_past, dv_past = _flash_backward(grad, q, k_past, v_past, out, lse, False, ctx.scale)
        return dq + dq_past, dk_past, dv_past, dk_own, dv_own, None


def _flash(q, k, v, causal: bool, scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [N, Hq, c, D], log-sum-exp [N, Hq, c] float32) of torch's flash attention (grouped-query key and value
    heads broadcast)."""
    if q.device.type != "cpu":
        raise NotImplementedError("context-parallel attention has a CPU kernel only (it has not run on a GPU)")
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q.contiguous(), k.contiguous(), v.contiguous(), 0.0, causal, scale=scale
    )
    return out, lse.float()


def _flash_backward(grad, q, k, v, out, lse, causal: bool, scale: float | None):
    """(dq, dk, dv) of :func:`_flash` for the softmax whose output and log-sum-exp are ``out``, ``lse``."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q.contiguous(), k.contiguous(), v.contiguous(), out, lse, 0.0, causal, scale=scale
    )


def segment_mask(*args, **kwargs) -> torch.Tensor | None:
    """transformers' mask for :data:`KERNEL`: none for a forward without a padding mask (the kernel takes the
    sequences from the rows and ``Segments``), else SDPA's."""
    return None if kwargs.get("attention_mask") is None else sdpa_mask(*args, **kwargs)


AttentionInterface.register(KERNEL, segment_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(KERNEL, segment_mask)
