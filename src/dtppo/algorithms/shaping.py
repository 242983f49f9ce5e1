"""Reward shaping by response length: DAPO's soft overlong punishment (Yu et al. 2025, §3.4, eq. 13)."""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_tokens: int, buffer: int, factor: float) -> torch.Tensor:
    """``min(−(L − (max_tokens − buffer)) / buffer · factor, 0)``: 0 up to ``max_tokens − buffer`` tokens, then
    falling linearly to ``−factor`` at ``max_tokens``. lengths: [B] response tokens -> [B] float32, <= 0."""
    excess = lengths.float() - (max_tokens - buffer)
    return torch.clamp(-excess / buffer * factor, max=0.0)
