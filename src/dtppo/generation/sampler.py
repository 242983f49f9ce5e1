"""Batched sampling: one prefill, then one decode step per new token over a KV cache.

Randomness is counter-based: the one uniform that picks sample i's token t is a hash of (key, i, t), with
``key`` derived from (seed, step), and the token is drawn by inverting the cumulative distribution at it. A
sample's tokens therefore depend only on its global index, not on batch composition or on which rank generates
it, and need no RNG state to resume. One number per row and step, not one per vocabulary entry: hashing every
cell of a [rows, 151,936] vocabulary cost more than the decode step itself (bench/perf/sampling.py).

Speed (bench/perf/vllm_rollout.py): the decoder (``rollout.decoder``, chosen by ``rollout.generator``) computes the
next-token logits; stop tokens are checked on the host only every few steps, and tokens sampled after a row's
stop token are blanked once at the end.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dtppo.generation.decoder import HFCacheDecoder, StaticKVDecoder
from dtppo.types import Experience, SamplingParams, build_response_mask

# splitmix64 constants as signed int64 (torch has no uint64 arithmetic); products wrap modulo 2**64.
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)

# The inverse CDF is searched in two levels: block sums over the vocabulary, then the chosen block's entries, so
# no [rows, vocabulary] cumulative sum is built.
_CDF_BLOCK = 1024
# Rows finish at a stop token; whether all have is read on the host only every this many steps (a host sync on GPU).
_STOP_CHECK_PERIOD = 8


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def splitmix(x: torch.Tensor) -> torch.Tensor:
    x = x * _GOLDEN
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    return x ^ _shr(x, 31)


def counter_uniform_steps(key: int, sample_ids: torch.Tensor, t0: int, steps: int, width: int) -> torch.Tensor:
    """Uniform (0, 1) numbers for tokens t0 .. t0+steps-1, ``width`` per row and token: [B] -> [steps, B, width]
    float64 with 52 random bits (fine enough to invert a CDF whose smallest entries are ~1e-9).

    Cell (s, i, j) depends only on (key, sample_ids[i], t0 + s, j), so any chunking of t gives the same bits.
    """
    device = sample_ids.device
    t = torch.arange(t0, t0 + steps, device=device)
    base = splitmix(sample_ids.long() + splitmix(torch.tensor(key, dtype=torch.long, device=device)))
    row = splitmix(base[None, :] + t[:, None])
    cells = splitmix(row[:, :, None] + torch.arange(width, device=device))
    return (_shr(cells, 12).double() + 0.5) / float(1 << 52)


def counter_uniform(key: int, sample_ids: torch.Tensor, t: int, width: int) -> torch.Tensor:
    """Uniform (0, 1) numbers that depend only on (key, sample id, t, column). sample_ids: [B] -> [B, width]."""
    return counter_uniform_steps(key, sample_ids, t, 1, width)[0]


def stream_key(seed: int, step: int, stream: int = 0) -> int:
    """One integer per (seed, step, stream); stream 0 is training rollouts, 1 validation."""
    return int(splitmix(torch.tensor(seed * 1_000_003 + step * 7 + stream, dtype=torch.long)))


def turn_key(key: int, turn: int) -> int:
    """The stream key of an episode's ``turn``-th assistant turn (0-based): ``key`` itself for the first, so a
    one-turn episode draws what a single response does; a fresh key for each later turn."""
    return key if turn == 0 else int(splitmix(torch.tensor(key, dtype=torch.long) + turn))


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability reaches ``top_p``. logits: [B, V]."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    drop_sorted = probs.cumsum(-1) - probs >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def _below(x: torch.Tensor) -> torch.Tensor:
    """The largest float64 smaller than each entry of ``x`` (keeps a rounded target inside its interval)."""
    return torch.nextafter(x, torch.zeros_like(x))


def inverse_cdf(logits: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The smallest token v with cumsum(p)[v] > u, for p = softmax(logits): an exact draw when u ~ U(0, 1).

    logits: [B, V] float32 (-inf for excluded tokens, which are never drawn); uniform: [B] float64 in (0, 1).
    Returns [B] int64. Weights exp(logits - max) are summed per block of ``_CDF_BLOCK`` entries; u·total picks
    the block, then the block's own float64 cumulative sum picks the token.
    """
    batch, vocab = logits.shape
    weights = torch.exp(logits - logits.max(-1, keepdim=True).values)
    whole = vocab // _CDF_BLOCK * _CDF_BLOCK
    sums = torch.cat(
        [weights[:, :whole].view(batch, -1, _CDF_BLOCK).sum(-1), weights[:, whole:].sum(-1, keepdim=True)], dim=-1
    ).double()  # [B, blocks]
    cum = sums.cumsum(-1)
    target = torch.minimum(uniform * cum[:, -1], _below(cum[:, -1]))
    block = torch.searchsorted(cum, target[:, None], right=True).clamp(max=cum.shape[1] - 1)  # [B, 1]
    before = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=-1).gather(-1, block)
    columns = block * _CDF_BLOCK + torch.arange(_CDF_BLOCK, device=logits.device)  # [B, block]
    inside = weights.gather(-1, columns.clamp(max=vocab - 1)).masked_fill(columns >= vocab, 0).double().cumsum(-1)
    offset = torch.minimum(target[:, None] - before, _below(inside[:, -1:]))
    return (columns[:, :1] + torch.searchsorted(inside, offset, right=True)).squeeze(-1).clamp(max=vocab - 1)


def pick_tokens(
    logits: torch.Tensor, params: SamplingParams, uniform: torch.Tensor | None, banned: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``choose_tokens`` with the randomness given: uniform [B] float64 (unused when greedy). ``banned`` [S] int64:
    token ids that cannot be drawn at this step (the stop set before ``min_new_tokens``); the log-prob returned is
    then of the distribution renormalised without them, the one actually sampled from (as vLLM's
    ``processed_logprobs`` after its min-tokens processor)."""
    scaled = logits.float() if params.temperature == 1.0 else logits.float() / params.temperature
    if banned is not None:
        scaled = scaled.index_fill(-1, banned, float("-inf"))
    if params.greedy:
        tokens = scaled.argmax(-1)
    else:
        tokens = inverse_cdf(_top_p_filter(scaled, params.top_p) if params.top_p < 1.0 else scaled, uniform)
    chosen = scaled.gather(-1, tokens[:, None]).squeeze(-1)
    return tokens, chosen - torch.logsumexp(scaled, dim=-1)


def choose_tokens(
    logits: torch.Tensor, params: SamplingParams, key: int, sample_ids: torch.Tensor, t: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the next token of each row and its log-prob under softmax(logits / temperature).

    logits: [B, V] float32; sample_ids: [B]. Returns (tokens [B] int64, logprobs [B] float32). Sampling inverts
    the CDF of the (top-p filtered) tempered distribution at one counter-based uniform per row.
    """
    uniform = None if params.greedy else counter_uniform(key, sample_ids, t, 1)[:, 0]
    return pick_tokens(logits, params, uniform)


def left_padded(
    prompts: list[list[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention_mask, prompt_lengths): prompts left-padded so every row's next token is column W."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long, device=device)
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    attn = (torch.arange(width, device=device)[None] >= (width - lengths)[:, None]).long()
    return ids, attn, lengths


def sample_tokens(
    decoder: StaticKVDecoder | HFCacheDecoder,
    ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_lengths: torch.Tensor,
    params: SamplingParams,
    stop_ids: Sequence[int],
    pad_id: int,
    key: int,
    sample_ids: torch.Tensor,
) -> Experience:
    """Sample a response for every prompt with ``decoder``; returns right-padded ``[prompt | response | pad]`` rows.

    ids, attention_mask: [B, W] left-padded prompts (``left_padded``); prompt_lengths: [B]; sample_ids: [B] global
    sample indices (drive the noise); stop_ids: the tokens that end a response
    (``models.causal_lm.stop_token_ids``), never drawn before token ``params.min_new_tokens``. The response
    includes its first stop token; rows without one are ``truncated``. The decoder is one fresh for this rollout,
    or a compiled one refreshed (``rollout.generator``).
    """
    device = ids.device
    batch, max_new = ids.shape[0], params.max_new_tokens
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = decoder.start(ids, attention_mask, positions, prompt_lengths, max_new)
    uniforms = None if params.greedy else counter_uniform_steps(key, sample_ids.to(device), 0, max_new, 1)[..., 0]
    stop = torch.tensor(list(stop_ids), dtype=torch.long, device=device)
    tokens = torch.full((max_new, batch), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((max_new, batch), device=device)
    steps = max_new
    for t in range(max_new):
        banned = stop if t < params.min_new_tokens else None
        tok, lp = pick_tokens(logits, params, None if uniforms is None else uniforms[t], banned)
        tokens[t], logprobs[t] = tok, lp
        if t == max_new - 1 or (
            (t + 1) % _STOP_CHECK_PERIOD == 0 and bool(torch.isin(tokens[: t + 1], stop).any(0).all())
        ):
            steps = t + 1
            break
        logits = decoder.step(tok, t)
    return right_padded(ids, prompt_lengths, tokens[:steps].T, logprobs[:steps].T, stop_ids, pad_id)


def right_padded(
    ids: torch.Tensor,
    prompt_lengths: torch.Tensor,
    tokens: torch.Tensor,
    logprobs: torch.Tensor,
    stop_ids: Sequence[int],
    pad_id: int,
) -> Experience:
    """Left-padded prompts ``ids`` [B, W] + sampled ``tokens``, ``logprobs`` [B, N] -> right-padded rows.

    Everything a row sampled after its first stop token (any of ``stop_ids``) is dropped here, once, instead of
    masked step by step; a row without one is ``truncated``.
    """
    batch, width = ids.shape
    max_new = tokens.shape[1]
    is_stop = torch.isin(tokens, torch.tensor(list(stop_ids), dtype=torch.long, device=tokens.device))
    stopped = is_stop.any(-1)
    response_lengths = torch.where(stopped, is_stop.float().argmax(-1) + 1, max_new)
    total = prompt_lengths + response_lengths
    seq_len = int(total.max())
    # Row b of [prompt | response] starts at column W - prompt_length[b] of the left-padded layout.
    columns = (width - prompt_lengths)[:, None] + torch.arange(seq_len, device=ids.device)[None]
    columns = columns.clamp(max=width + max_new - 1)
    valid = torch.arange(seq_len, device=ids.device)[None] < total[:, None]
    input_ids = torch.cat([ids, tokens], dim=1).gather(1, columns).masked_fill(~valid, pad_id)
    in_response = build_response_mask(prompt_lengths, response_lengths, seq_len)
    padded_logprobs = torch.cat([torch.zeros_like(ids, dtype=logprobs.dtype), logprobs], dim=1)
    gen_logprobs = padded_logprobs.gather(1, columns) * in_response
    return Experience(
        input_ids=input_ids,
        attention_mask=valid.long(),
        response_mask=in_response,
        gen_logprobs=gen_logprobs,
        truncated=~stopped,
    )
