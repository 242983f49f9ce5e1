"""Validation: generate answers to held-out problems, then score them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import PreTrainedTokenizerBase

from dtppo.config import TASK_VERIFIERS, Config
from dtppo.data.loader import encode_prompts
from dtppo.data.problem import Problem, Prompt
from dtppo.envs.interface import episode_row
from dtppo.rewards.functions import reward_function
from dtppo.rollout.generator import Generator
from dtppo.rollout.sampler import SamplingParams, stream_key
from dtppo.types import Experience


@dataclass(frozen=True)
class Responses:
    """The generated text of each validation problem and its length in tokens."""

    texts: list[str]
    lengths: list[int]


@dataclass(frozen=True)
class EvalResult:
    """accuracy: the verifier's mean (None for a task without one); reward: the mean total reward; rewards: each
    reward part's mean by metric name; samples: (prompt, response, reference, total reward) per problem."""

    accuracy: float | None
    reward: float
    rewards: dict[str, float]
    avg_length: float
    samples: list[tuple[Prompt, str, Any, float]]


def decode_responses(tokenizer: PreTrainedTokenizerBase, experience: Experience) -> list[str]:
    """The generated text of each row (response tokens only, special tokens dropped): in a multi-turn episode, its
    last assistant turn's (the final answer, what the reward functions score)."""
    mask = experience.response_mask.bool()
    if experience.turn_ids is not None:
        mask &= experience.turn_ids == experience.turn_ids.max(-1, keepdim=True).values
    return [tokenizer.decode(row[m].tolist(), skip_special_tokens=True) for row, m in zip(experience.input_ids, mask)]


class Sampler(Protocol):
    """What validation needs of a generator: ``Generator.sample`` (the generation ranks' client has it too)."""

    def sample(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        key: int,
        sample_ids: torch.Tensor,
        rows: list[dict] | None = None,
    ) -> Experience: ...


@torch.no_grad()
def sample_responses(
    generator: Sampler, tokenizer: PreTrainedTokenizerBase, problems: list[Problem], cfg: Config, step: int
) -> Responses:
    """Answers to ``problems`` in batches of ``ppo.val_batch_size`` (greedy when ``policy.generation.val_greedy``)."""
    gen = cfg.policy.generation
    params = SamplingParams(gen.max_new_tokens, gen.temperature, gen.top_p, greedy=gen.val_greedy)
    texts, lengths = [], []
    for start in range(0, len(problems), cfg.ppo.val_batch_size):
        batch = problems[start : start + cfg.ppo.val_batch_size]
        prompts = encode_prompts(tokenizer, batch, cfg.data.system_prompt, cfg.data.max_prompt_tokens)
        key, ids = stream_key(cfg.ppo.seed, step, stream=1), torch.arange(start, start + len(batch))
        experience = generator.sample(prompts, params, key, ids, [episode_row(p) for p in batch])
        texts += decode_responses(tokenizer, experience)
        lengths += experience.response_mask.sum(-1).tolist()
    return Responses(texts, lengths)


def eval_result(
    problems: list[Problem],
    responses: Responses,
    total: torch.Tensor,
    means: dict[str, float],
    accuracy_name: str | None,
    failed: torch.Tensor | None = None,
) -> EvalResult:
    """The figures of a scored validation: ``total`` [B] the total reward of each response, ``means`` each part's
    (over the responses it scored); ``failed`` [B] bool, responses whose reward chunk failed, left out of the mean
    reward (NaN when none was scored)."""
    samples = [(p.question, t, p.answer, float(s)) for p, t, s in zip(problems, responses.texts, total)]
    scored = total if failed is None else total[~failed]
    return EvalResult(
        accuracy=means.get(accuracy_name) if accuracy_name else None,
        reward=float(scored.mean()) if len(scored) else float("nan"),
        rewards=means,
        avg_length=sum(responses.lengths) / len(responses.lengths),
        samples=samples,
    )


def evaluate(
    generator: Generator, tokenizer: PreTrainedTokenizerBase, problems: list[Problem], cfg: Config, step: int
) -> EvalResult:
    """Validation scored by the task's verifier alone, in this process: SFT's, whose tasks all have one."""
    generator.prepare()
    responses = sample_responses(generator, tokenizer, problems, cfg, step)
    generator.finish()
    name = TASK_VERIFIERS[cfg.data.task]
    scores = reward_function(name)(
        prompts=[p.question for p in problems], completions=responses.texts, answer=[p.answer for p in problems]
    )
    total = torch.tensor(scores, dtype=torch.float32)
    return eval_result(problems, responses, total, {name: float(total.mean())}, name)
