"""Batched sampling with a KV cache: prefill once, then one forward per new token.

Randomness is counter-based: the Gumbel noise for sample i, token t, vocab entry v is a hash of
(key, i, t, v), with ``key`` derived from (seed, step). A sample's tokens therefore depend only on its global
index, not on batch composition or on which rank generates it, and need no RNG state to resume.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from dtppo.types import Experience, build_response_mask

# splitmix64 constants as signed int64 (torch has no uint64 arithmetic); products wrap modulo 2**64.
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _splitmix(x: torch.Tensor) -> torch.Tensor:
    x = x * _GOLDEN
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    return x ^ _shr(x, 31)


def counter_uniform(key: int, sample_ids: torch.Tensor, t: int, vocab_size: int) -> torch.Tensor:
    """Uniform (0, 1) noise that depends only on (key, sample id, t, vocab index). sample_ids: [B] -> [B, V]."""
    row = _splitmix(_splitmix(sample_ids.long() + _splitmix(torch.tensor(key, dtype=torch.long))) + t)
    cells = _splitmix(row[:, None] + torch.arange(vocab_size, device=sample_ids.device)[None, :])
    return (_shr(cells, 40).double() + 0.5) / float(1 << 24)


def stream_key(seed: int, step: int, stream: int = 0) -> int:
    """One integer per (seed, step, stream); stream 0 is training rollouts, 1 validation."""
    return int(_splitmix(torch.tensor(seed * 1_000_003 + step * 7 + stream, dtype=torch.long)))


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability reaches ``top_p``. logits: [B, V]."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    drop_sorted = probs.cumsum(-1) - probs >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def choose_tokens(
    logits: torch.Tensor, params: SamplingParams, key: int, sample_ids: torch.Tensor, t: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the next token of each row and its log-prob under softmax(logits / temperature).

    logits: [B, V] float32; sample_ids: [B]. Returns (tokens [B] int64, logprobs [B] float32). Sampling is
    Gumbel-max on the (top-p filtered) tempered logits, which draws exactly from that distribution.
    """
    scaled = logits.float() / params.temperature
    logp = torch.log_softmax(scaled, dim=-1)
    if params.greedy:
        tokens = scaled.argmax(-1)
    else:
        filtered = _top_p_filter(scaled, params.top_p) if params.top_p < 1.0 else scaled
        gumbel = -torch.log(-torch.log(counter_uniform(key, sample_ids, t, scaled.shape[-1]))).float()
        tokens = (filtered + gumbel).argmax(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def _cache_kwarg(model: PreTrainedModel) -> str:
    """transformers >= 5.2x names the KV cache ``cache``; earlier 5.x releases ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    prompts: list[list[int]],
    params: SamplingParams,
    eos_id: int,
    pad_id: int,
    key: int,
    sample_ids: torch.Tensor,
) -> Experience:
    """Sample a response for every prompt; returns right-padded ``[prompt | response | pad]`` rows.

    prompts: B lists of token ids; sample_ids: [B] global sample indices (drive the noise).
    The response includes the EOS token when one was sampled; rows without EOS are ``truncated``.
    """
    device = next(model.parameters()).device
    batch = len(prompts)
    prompt_lengths = torch.tensor([len(p) for p in prompts], device=device)
    width = int(prompt_lengths.max())
    # Left-pad for the batched prefill so every row's next token sits in the last column.
    ids = torch.full((batch, width), pad_id, dtype=torch.long, device=device)
    attn = torch.zeros((batch, width), dtype=torch.long, device=device)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):] = torch.tensor(p, device=device)
        attn[b, width - len(p):] = 1
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    cache = {_cache_kwarg(model): DynamicCache()}
    out = model(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=True, logits_to_keep=1,
                **cache)
    tokens = torch.full((batch, params.max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((batch, params.max_new_tokens), device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    next_pos = positions[:, -1] + 1
    for t in range(params.max_new_tokens):
        tok, lp = choose_tokens(out.logits[:, -1], params, key, sample_ids.to(device), t)
        tokens[:, t] = torch.where(finished, pad_id, tok)
        logprobs[:, t] = torch.where(finished, 0.0, lp)
        finished |= tok == eos_id
        if bool(finished.all()) or t == params.max_new_tokens - 1:
            break
        attn = torch.cat([attn, torch.ones((batch, 1), dtype=attn.dtype, device=device)], dim=1)
        out = model(input_ids=tokens[:, t : t + 1], attention_mask=attn, position_ids=next_pos[:, None],
                    use_cache=True, **cache)
        next_pos = next_pos + 1
    return _right_padded(prompts, prompt_lengths, tokens, logprobs, eos_id, pad_id)


def _right_padded(
    prompts: list[list[int]],
    prompt_lengths: torch.Tensor,
    tokens: torch.Tensor,
    logprobs: torch.Tensor,
    eos_id: int,
    pad_id: int,
) -> Experience:
    """Re-lay left-padded prompts + responses as right-padded rows. tokens, logprobs: [B, N]."""
    batch, max_new = tokens.shape
    is_eos = tokens == eos_id
    has_eos = is_eos.any(-1)
    response_lengths = torch.where(has_eos, is_eos.float().argmax(-1) + 1, max_new)
    seq_len = int((prompt_lengths + response_lengths).max())
    input_ids = torch.full((batch, seq_len), pad_id, dtype=torch.long, device=tokens.device)
    gen_logprobs = torch.zeros((batch, seq_len), device=tokens.device)
    for b, p in enumerate(prompts):
        n_p, n_r = len(p), int(response_lengths[b])
        input_ids[b, :n_p] = torch.tensor(p, device=tokens.device)
        input_ids[b, n_p : n_p + n_r] = tokens[b, :n_r]
        gen_logprobs[b, n_p : n_p + n_r] = logprobs[b, :n_r]
    response_mask = build_response_mask(prompt_lengths, response_lengths, seq_len)
    attention_mask = (torch.arange(seq_len, device=tokens.device)[None] < (prompt_lengths + response_lengths)[:, None]).long()
    return Experience(input_ids=input_ids, attention_mask=attention_mask, response_mask=response_mask,
                      gen_logprobs=gen_logprobs, truncated=~has_eos)
