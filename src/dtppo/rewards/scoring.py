"""Scoring a batch of responses against their ground truths."""

from __future__ import annotations

import torch

from dtppo.rewards.math import gsm8k_reward


def score_responses(responses: list[str], ground_truths: list[str]) -> torch.Tensor:
    """Verifier reward per sample. Returns [B] float32 of 0.0 / 1.0; never raises (gsm8k_reward is total)."""
    return torch.tensor([gsm8k_reward(r, g) for r, g in zip(responses, ground_truths)], dtype=torch.float32)
