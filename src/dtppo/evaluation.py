"""Validation: generate answers to held-out problems and score them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dtppo.config import Config
from dtppo.data.loader import encode_prompts
from dtppo.data.problem import Problem
from dtppo.rewards.scoring import score_responses
from dtppo.rollout.sampler import SamplingParams, generate, stream_key
from dtppo.types import Experience


@dataclass(frozen=True)
class EvalResult:
    accuracy: float
    avg_length: float
    samples: list[tuple[str, str, str, float]]  # (question, response, ground truth, reward)


def decode_responses(tokenizer: PreTrainedTokenizerBase, experience: Experience) -> list[str]:
    """The generated text of each row (response tokens only, special tokens dropped)."""
    mask = experience.response_mask.bool()
    return [tokenizer.decode(row[m].tolist(), skip_special_tokens=True) for row, m in zip(experience.input_ids, mask)]


# (prompts, params, stream key, sample ids [B]) -> Experience: PolicyWorker.sample, whatever the backend.
Sampler = Callable[[list[list[int]], SamplingParams, int, torch.Tensor], Experience]


def model_sampler(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Sampler:
    """dtppo's torch sampler on ``model`` (switched to eval mode) as a ``Sampler``: SFT's validation, which
    has no generation backend."""

    def sample(prompts: list[list[int]], params: SamplingParams, key: int, sample_ids: torch.Tensor) -> Experience:
        model.eval()
        return generate(model, prompts, params, tokenizer.eos_token_id, tokenizer.pad_token_id, key, sample_ids)

    return sample


@torch.no_grad()
def evaluate(sample: Sampler, tokenizer: PreTrainedTokenizerBase, problems: list[Problem], cfg: Config,
             step: int) -> EvalResult:
    """Accuracy and mean response length on ``problems`` (greedy when ``policy.generation.val_greedy``)."""
    gen = cfg.policy.generation
    params = SamplingParams(gen.max_new_tokens, gen.temperature, gen.top_p, greedy=gen.val_greedy)
    rewards, lengths, samples = [], [], []
    for start in range(0, len(problems), cfg.ppo.val_batch_size):
        batch = problems[start : start + cfg.ppo.val_batch_size]
        prompts = encode_prompts(tokenizer, batch, cfg.data.system_prompt, cfg.data.max_prompt_tokens)
        experience = sample(prompts, params, stream_key(cfg.ppo.seed, step, stream=1),
                            torch.arange(start, start + len(batch)))
        texts = decode_responses(tokenizer, experience)
        scores = score_responses(texts, [p.answer for p in batch])
        rewards.append(scores)
        lengths.append(experience.response_mask.sum(-1))
        samples += [(p.question, t, p.answer, float(s)) for p, t, s in zip(batch, texts, scores)]
    return EvalResult(
        accuracy=float(torch.cat(rewards).mean()), avg_length=float(torch.cat(lengths).mean()), samples=samples
    )
