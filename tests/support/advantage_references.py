"""Float64 reference loops for the advantage estimators, written from the papers' definitions, one token at a
time: GAE (Schulman et al. 2016) and GRPO's process supervision (DeepSeekMath §4.1.3)."""

from __future__ import annotations

import torch

from dtppo.algorithms.advantages import GRPO_STD_EPS


def reference_gae_returns(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """token_rewards, values, mask: [B, T] -> [B, T] float64 GAE returns over each row's masked tokens (V after the
    last is 0), 0 elsewhere."""
    returns = torch.zeros(mask.shape, dtype=torch.float64)
    for b in range(mask.shape[0]):
        tokens = [t for t in range(mask.shape[1]) if mask[b, t]]
        advantage, next_value = 0.0, 0.0
        for t in reversed(tokens):
            delta = float(token_rewards[b, t]) + gamma * next_value - float(values[b, t])
            advantage = delta + gamma * lam * advantage
            returns[b, t] = advantage + float(values[b, t])
            next_value = float(values[b, t])
    return returns


def reference_process(
    mask: torch.Tensor,
    outcome: torch.Tensor,
    steps: dict[tuple[int, int], float],
    group_size: int,
    sample_mask: list[int] | None = None,
    later: bool = True,
) -> torch.Tensor:
    """mask: [B, T]; outcome: [B]; steps: {(row, token): reward} -> [B, T] float64: each group's steps (its
    samples' step rewards and each outcome at its last token), normalised by their mean and Bessel std (+ eps),
    each token the sum of its sample's steps that end at or after it (``later=False``: at or before it, the
    wrong way round, for negative controls)."""
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for g in range(mask.shape[0] // group_size):
        group = []  # (row, token, reward)
        for b in range(group_size * g, group_size * (g + 1)):
            if sample_mask is not None and not sample_mask[b]:
                continue
            last = max(t for t in range(mask.shape[1]) if mask[b, t])
            on_token = {t: r for (row, t), r in steps.items() if row == b}
            on_token[last] = on_token.get(last, 0.0) + float(outcome[b])
            group += [(b, t, r) for t, r in on_token.items()]
        values = torch.tensor([r for _, _, r in group], dtype=torch.float64)
        mean, std = values.mean(), values.std(unbiased=True)
        for b, t, r in group:
            normalised = (r - mean) / (std + GRPO_STD_EPS)
            for u in range(t + 1) if later else range(t, mask.shape[1]):
                if mask[b, u]:
                    out[b, u] += normalised
    return out
