"""Which prompt groups carry a learning signal: the criteria of dynamic sampling (DAPO, Yu et al. 2025, §3.2).

A group is one prompt's ``group_size`` samples, adjacent rows ``g·G … g·G + G − 1`` (the trainer repeats each prompt
consecutively).
"""

from __future__ import annotations

import torch


def groups_with_reward_spread(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Groups whose samples' rewards are not all equal (DAPO's ``0 < |correct| < G``, the peers' ``std > 0``): with
    GRPO an all-equal group has zero advantages. rewards: [B] -> [B / group_size] bool."""
    grouped = rewards.reshape(-1, group_size)
    return grouped.max(dim=1).values > grouped.min(dim=1).values


def groups_with_value_error(
    returns: torch.Tensor, values: torch.Tensor, group_size: int, min_error: float
) -> torch.Tensor:
    """Groups with a sample whose return the critic missed by more than ``min_error``: with γ = λ = 1 a sample's
    advantages sum to R − V(s_0) over its tokens, so a group the critic predicts within ``min_error`` teaches the
    policy little, however its rewards spread. returns: [B] each sample's return from its first response token;
    values: [B] V(s_0) at that token (one value per prompt: the state is the prompt) -> [B / group_size] bool."""
    error = (returns - values).abs().reshape(-1, group_size)
    return error.max(dim=1).values > min_error


def first_response_token(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's entry at its first masked-in position (the first response token). x, mask: [B, T] -> [B]
    (the entry at position 0 for a row with no masked-in position)."""
    first = mask.float().argmax(dim=-1, keepdim=True)
    return x.gather(-1, first).squeeze(-1)
