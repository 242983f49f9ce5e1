"""The text of generated responses: what the reward functions score in training, and validation's answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

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


def decode_responses(tokenizer: PreTrainedTokenizerBase, experience: Experience) -> list[str]:
    """The generated text of each row (response tokens only, special tokens dropped): in a multi-turn episode, its
    last assistant turn's (the final answer, what the reward functions score)."""
    mask = experience.response_mask.bool()
    if experience.turn_ids is not None:
        mask &= experience.turn_ids == experience.turn_ids.max(-1, keepdim=True).values
    return [tokenizer.decode(row[m].tolist(), skip_special_tokens=True) for row, m in zip(experience.input_ids, mask)]


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
