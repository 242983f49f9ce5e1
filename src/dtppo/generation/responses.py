"""The text of generated responses: what the reward functions score in training, and validation's answers."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from dtppo.config import DataConfig, GenerationConfig, ValidationConfig
from dtppo.data.chat import encode_prompts
from dtppo.data.problem import Problem
from dtppo.envs.interface import episode_row
from dtppo.generation.sampler import stream_key
from dtppo.types import Experience, SampleRequest, SamplingParams


@dataclass(frozen=True)
class Responses:
    """The generated text of each validation problem and its length in tokens."""

    texts: list[str]
    lengths: list[int]


def scored_tokens(experience: Experience) -> torch.Tensor:
    """[B, T] bool: the tokens whose text the reward functions score: the response, in a multi-turn episode its last
    assistant turn (the final answer)."""
    mask = experience.response_mask.bool()
    if experience.turn_ids is not None:
        mask &= experience.turn_ids == experience.turn_ids.max(-1, keepdim=True).values
    return mask


def decode_responses(tokenizer: PreTrainedTokenizerBase, experience: Experience) -> list[str]:
    """The generated text of each row (``scored_tokens``, special tokens dropped)."""
    mask = scored_tokens(experience)
    return [tokenizer.decode(row[m].tolist(), skip_special_tokens=True) for row, m in zip(experience.input_ids, mask)]


def token_char_ends(
    tokenizer: PreTrainedTokenizerBase, ids: torch.Tensor, mask: torch.Tensor, texts: list[str]
) -> torch.Tensor:
    """Where each token's text ends in its row's decoded text: ids, mask: [R, T] (the tokens decoded: ``mask``
    true), texts: each row's ``decode(ids[mask], skip_special_tokens=True)`` -> [R, T] int64, the running sum of the
    decoded tokens' lengths (0 before the first; a dropped special token ends where the token before it does).

    Vectorised: every vocabulary entry is decoded alone once per tokenizer, and a row's ends are the running sum of
    its tokens' piece lengths. A row whose pieces do not make its text (a character split over byte tokens, a
    tokenizer that strips a lone token's leading space, cleaned-up spaces) is measured exactly instead, by
    decoding each of its prefixes."""
    return torch.from_numpy(_char_ends(tokenizer, ids.cpu().numpy(), mask.cpu().numpy().astype(bool), texts))


def _char_ends(tokenizer: PreTrainedTokenizerBase, ids: np.ndarray, keep: np.ndarray, texts: list[str]) -> np.ndarray:
    """``token_char_ends`` in NumPy, whose calls cost a few microseconds where a small tensor op costs ten or more:
    this runs once per step on a batch of a few thousand tokens."""
    pieces, lengths = _vocabulary_pieces(tokenizer)
    ends = np.where(keep, lengths[ids], 0).cumsum(axis=1)
    counts, flat = keep.sum(1).tolist(), ids[keep].tolist()
    # Every row's pieces make its text when the rows' lengths agree and so do all rows' texts joined: one check
    if ends[:, -1].tolist() == [len(t) for t in texts] and "".join([pieces[t] for t in flat]) == "".join(texts):
        return ends
    start = 0
    for r, (count, text) in enumerate(zip(counts, texts)):
        row, start = flat[start : start + count], start + count
        if "".join([pieces[t] for t in row]) != text:
            prefixes = tokenizer.batch_decode([row[: k + 1] for k in range(len(row))], skip_special_tokens=True)
            exact = np.zeros(ids.shape[1], dtype=np.int64)
            exact[keep[r]] = [len(p) for p in prefixes]
            ends[r] = np.maximum.accumulate(exact)
    return ends


_PIECES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _vocabulary_pieces(tokenizer: PreTrainedTokenizerBase) -> tuple[list[str], np.ndarray]:
    """(each token id's text decoded alone, special tokens as "", and [vocabulary] int64 their lengths), once per
    tokenizer."""
    if tokenizer not in _PIECES:
        ids = [[i] for i in range(len(tokenizer))]
        backend = getattr(tokenizer, "backend_tokenizer", None)  # one call into the Rust tokenizer when there is one
        decode = backend.decode_batch if backend is not None else tokenizer.batch_decode
        pieces = decode(ids, skip_special_tokens=True)
        _PIECES[tokenizer] = pieces, np.array([len(p) for p in pieces], dtype=np.int64)
    return _PIECES[tokenizer]


def place_steps(
    tokenizer: PreTrainedTokenizerBase,
    experience: Experience,
    steps: list[tuple[tuple[int, float], ...]],
    texts: list[str],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's step rewards (``(end, reward)`` pairs, ``end`` a character offset in its decoded response,
    ``texts``: ``decode_responses``) on the token holding character ``end − 1`` -> (rewards [B, T] float32, summed
    where steps share a token; mask [B, T] float32, 1 on those tokens), on the CPU."""
    mask = scored_tokens(experience)
    shape = mask.shape
    if not any(steps):
        return torch.zeros(shape), torch.zeros(shape)
    ends = _char_ends(tokenizer, experience.input_ids.cpu().numpy(), mask.cpu().numpy(), texts)  # [B, T]
    # One search over all rows: row b's ends shifted by b * span stay sorted (an end is at most its text's length,
    # the row's last end, below span), and a step's target is its end shifted as its row is.
    span = max(len(text) for text in texts) + 1
    targets = np.array([end + b * span for b, row in enumerate(steps) for end, _ in row], dtype=np.int64)  # [S]
    shifted = (ends + np.arange(shape[0])[:, None] * span).ravel()  # [B * T]
    token = np.searchsorted(shifted, targets, side="left")  # [S]: b * T + the token holding character end - 1
    rewards, marks = np.zeros(shape[0] * shape[1], dtype=np.float32), np.zeros(shape[0] * shape[1], dtype=np.float32)
    np.add.at(rewards, token, np.array([reward for row in steps for _, reward in row], dtype=np.float32))
    marks[token] = 1.0
    return torch.from_numpy(rewards.reshape(shape)), torch.from_numpy(marks.reshape(shape))


class Sampler(Protocol):
    """What validation needs of a generator: ``Generator.sample`` (the generation ranks' client has it too)."""

    def sample(self, request: SampleRequest) -> Experience: ...


@torch.no_grad()
def sample_responses(
    generator: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    generation: GenerationConfig,
    validation: ValidationConfig,
    data: DataConfig,
    seed: int,
    step: int,
    first_index: int = 0,
) -> Responses:
    """Answers to ``problems``, sampled as the sections say (``generation``'s lengths and temperature,
    ``validation``'s batch size and greediness, ``data``'s prompt format), in batches. ``first_index``: the
    first problem's place in the whole set, whose index seeds its answer's noise (with ``seed`` and ``step``): a
    share of the set sampled on one rank draws what the whole set sampled at once would."""
    params = SamplingParams(
        generation.max_new_tokens, generation.temperature, generation.top_p, greedy=validation.greedy
    )
    texts, lengths = [], []
    for start in range(0, len(problems), validation.batch_size):
        batch = problems[start : start + validation.batch_size]
        prompts = encode_prompts(tokenizer, batch, data)
        key = stream_key(seed, step, stream=1)
        ids = torch.arange(first_index + start, first_index + start + len(batch))
        experience = generator.sample(SampleRequest(prompts, params, key, ids, [episode_row(p) for p in batch]))
        texts += decode_responses(tokenizer, experience)
        lengths += experience.response_mask.sum(-1).tolist()
    return Responses(texts, lengths)
