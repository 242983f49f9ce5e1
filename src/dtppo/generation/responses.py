"""The text of generated responses: what the reward functions score in training, and validation's answers."""

from __future__ import annotations

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


@dataclass(frozen=True)
class ResponseTokens:
    """The tokens whose text the reward functions score, on the CPU in NumPy: ids: [B, T] int64, the rows' token ids;
    keep: [B, T] bool, ``scored_tokens``."""

    ids: np.ndarray
    keep: np.ndarray


def response_tokens(experience: Experience) -> ResponseTokens:
    """``experience``'s scored tokens, read off once for decoding and for placing step rewards."""
    return ResponseTokens(experience.input_ids.cpu().numpy(), scored_tokens(experience).cpu().numpy())


def decode_tokens(tokenizer: PreTrainedTokenizerBase, tokens: ResponseTokens) -> list[str]:
    """Each row's kept tokens decoded, special tokens dropped."""
    return [tokenizer.decode(row[k].tolist(), skip_special_tokens=True) for row, k in zip(tokens.ids, tokens.keep)]


def decode_responses(tokenizer: PreTrainedTokenizerBase, experience: Experience) -> list[str]:
    """The generated text of each row (``scored_tokens``, special tokens dropped)."""
    return decode_tokens(tokenizer, response_tokens(experience))


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
