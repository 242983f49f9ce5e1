"""The text of generated responses: what the reward functions score in training, and validation's answers."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from itertools import chain
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
    ends = (lengths[ids] * keep).cumsum(axis=1)
    flat = ids[keep]
    # Every row's pieces make its text when the rows' lengths agree and so do all rows' texts joined: one check
    if ends[:, -1].tolist() == [len(t) for t in texts] and "".join(pieces[flat].tolist()) == "".join(texts):
        return ends
    start = 0
    for r, (count, text) in enumerate(zip(keep.sum(1).tolist(), texts)):
        row, start = flat[start : start + count].tolist(), start + count
        if "".join(pieces[row].tolist()) != text:
            prefixes = tokenizer.batch_decode([row[: k + 1] for k in range(len(row))], skip_special_tokens=True)
            exact = np.zeros(ids.shape[1], dtype=np.int64)
            exact[keep[r]] = [len(p) for p in prefixes]
            ends[r] = np.maximum.accumulate(exact)
    return ends


_PIECES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _vocabulary_pieces(tokenizer: PreTrainedTokenizerBase) -> tuple[np.ndarray, np.ndarray]:
    """([vocabulary] object, each token id's text decoded alone, special tokens as ""; [vocabulary] int64, their
    lengths), once per tokenizer. An object array: a batch's pieces are gathered by one indexing, not a loop."""
    if tokenizer not in _PIECES:
        ids = [[i] for i in range(len(tokenizer))]
        backend = getattr(tokenizer, "backend_tokenizer", None)  # one call into the Rust tokenizer when there is one
        decode = backend.decode_batch if backend is not None else tokenizer.batch_decode
        pieces = np.empty(len(ids), dtype=object)
        pieces[:] = decode(ids, skip_special_tokens=True)
        _PIECES[tokenizer] = pieces, np.array([len(p) for p in pieces], dtype=np.int64)
    return _PIECES[tokenizer]


def place_steps(
    tokenizer: PreTrainedTokenizerBase,
    experience: Experience,
    steps: list[tuple[tuple[int, float], ...]],
    texts: list[str],
) -> torch.Tensor:
    """Each row's step rewards (``(end, reward)`` pairs, ``end`` a character offset in its decoded response,
    ``texts``: ``decode_responses``) on the token holding character ``end − 1`` -> [2, B, T] float32 on the CPU:
    the rewards (summed where steps share a token) and the mask of the tokens that hold a step."""
    keep = scored_tokens(experience).cpu().numpy()
    batch, width = keep.shape
    counts = [len(row) for row in steps]
    placed = np.zeros((2, batch * width), dtype=np.float32)
    if any(counts):
        ends = _char_ends(tokenizer, experience.input_ids.cpu().numpy(), keep, texts)  # [B, T]
        # One search over all rows: row b's ends shifted by b * span stay sorted (an end is at most its text's
        # length, the row's last end, below span), and a step's target is its end shifted as its row is.
        span = int(ends[:, -1].max()) + 1
        ends += np.arange(0, batch * span, span)[:, None]
        pairs = np.fromiter(chain.from_iterable(chain.from_iterable(steps)), np.float64).reshape(-1, 2)  # [S, 2]
        targets = pairs[:, 0].astype(np.int64) + np.repeat(np.arange(0, batch * span, span), counts)  # [S]
        token = np.searchsorted(ends.ravel(), targets, side="left")  # [S]: b * T + the token holding character end - 1
        placed[0] = np.bincount(token, weights=pairs[:, 1], minlength=batch * width)
        placed[1, token] = 1.0
    return torch.from_numpy(placed.reshape(2, batch, width))


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
