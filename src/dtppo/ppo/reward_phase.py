"""The reward phase of a PPO step: rank 0 decodes the responses, scores them (``Rewarder``) and places their step
rewards on tokens; every rank then receives the same reward tensors and adds them to its batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from dtppo.data.problem import Problem
from dtppo.distributed.comm import broadcast
from dtppo.generation.responses import decode_tokens, response_tokens
from dtppo.generation.step_placement import StepPlacer
from dtppo.rewards.rewarder import RewardBreakdown, Rewarder
from dtppo.types import Experience


@dataclass(frozen=True)
class BatchRewards:
    """outcome: [B] float32, each sample's outcome reward (on its last token). failed: [B] float32, 1 for the
    samples of a chunk that could not be scored. steps: [2, B, T] float32, the step rewards on their tokens and
    the mask of those tokens; None when no sample has a step."""

    outcome: torch.Tensor
    failed: torch.Tensor
    steps: torch.Tensor | None


def score_batch(
    rewarder: Rewarder, tokenizer: PreTrainedTokenizerBase, experience: Experience, problems: list[Problem]
) -> tuple[RewardBreakdown, BatchRewards]:
    """Rank 0's part: the breakdown of ``experience``'s responses to ``problems`` and its reward tensors."""
    tokens = response_tokens(experience)
    texts = decode_tokens(tokenizer, tokens)
    placer = StepPlacer(tokenizer, tokens, texts)
    # A run's functions give steps on every batch or on none: after a batch with steps, this one's tokens are
    # measured while the scoring processes work
    scored = rewarder.score(problems, texts, while_scoring=placer.prepare if rewarder.gave_steps else None)
    steps = placer.place(scored.steps) if any(scored.steps) else None
    return scored, BatchRewards(scored.outcome, scored.failed.float(), steps)


def rewarded(
    rewarder: Rewarder | None,
    tokenizer: PreTrainedTokenizerBase,
    experience: Experience,
    problems: list[Problem],
    penalties: torch.Tensor,
) -> tuple[Experience, RewardBreakdown | None]:
    """The reward phase on every rank: rank 0 (the one given ``rewarder``; None elsewhere) scores the batch and
    places its steps, every rank receives the reward tensors and adds them, with ``penalties`` ([B], DAPO's overlong
    shaping), to ``experience`` -> (``experience`` with its rewards, the breakdown on rank 0 and None elsewhere)."""
    scored, rewards = None, None
    if rewarder is not None:
        scored, rewards = score_batch(rewarder, tokenizer, experience, problems)
    return with_rewards(experience, shared(rewards, experience), penalties), scored


def shared(rewards: BatchRewards | None, experience: Experience) -> BatchRewards:
    """Rank 0's ``rewards`` on every rank (the others pass None); the step tensors travel only when there are
    some."""
    batch = experience.batch_size
    if rewards is None:
        head = torch.zeros(3, batch)
    else:
        head = torch.stack([rewards.outcome, rewards.failed, torch.full((batch,), float(rewards.steps is not None))])
    outcome, failed, stepped = broadcast(head)
    steps = None
    if stepped.any():
        mine = rewards.steps if rewards is not None else None
        steps = broadcast(mine if mine is not None else torch.zeros(2, *experience.response_mask.shape))
    return BatchRewards(outcome, failed, steps)


def with_rewards(experience: Experience, rewards: BatchRewards, penalties: torch.Tensor) -> Experience:
    """``experience`` with its rewards: the outcome plus ``penalties`` ([B], DAPO's overlong shaping), the step
    rewards added to an episode's turn rewards, and the failed samples out of training (``sample_mask``: no
    reward is known for them)."""
    fields = {"rewards": rewards.outcome + penalties}
    if rewards.steps is not None:
        step_rewards, step_mask = rewards.steps
        if experience.step_rewards is not None:
            step_rewards = experience.step_rewards + step_rewards
            step_mask = torch.maximum(experience.step_mask, step_mask)
        fields |= {"step_rewards": step_rewards, "step_mask": step_mask}
    if rewards.failed.any():
        fields["sample_mask"] = 1.0 - rewards.failed
    return experience.replace(**fields)
