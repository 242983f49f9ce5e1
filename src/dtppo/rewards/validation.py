"""Validation's figures: the policy's answers to held-out problems, scored like training samples."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dtppo.data.problem import Problem, Prompt


@dataclass(frozen=True)
class EvalResult:
    """accuracy: the verifier's mean (None for a task without one); reward: the mean total reward; rewards: each
    reward part's mean by metric name; samples: (prompt, response, reference, total reward) per problem; step: the
    steps the evaluated policy was trained (0: the starting policy)."""

    accuracy: float | None
    reward: float
    rewards: dict[str, float]
    avg_length: float
    samples: list[tuple[Prompt, str, Any, float]]
    step: int = 0


def eval_result(
    problems: list[Problem],
    texts: list[str],
    lengths: list[int],
    total: torch.Tensor,
    means: dict[str, float],
    accuracy_name: str | None,
    failed: torch.Tensor | None = None,
) -> EvalResult:
    """The figures of a scored validation: ``texts`` each problem's response and ``lengths`` its length in tokens;
    ``total`` [B] the total reward of each response, ``means`` each part's (over the responses it scored);
    ``failed`` [B] bool, responses whose reward chunk failed, left out of the mean reward (NaN when none was
    scored)."""
    samples = [(p.question, t, p.answer, float(s)) for p, t, s in zip(problems, texts, total)]
    scored = total if failed is None else total[~failed]
    return EvalResult(
        accuracy=means.get(accuracy_name) if accuracy_name else None,
        reward=float(scored.mean()) if len(scored) else float("nan"),
        rewards=means,
        avg_length=sum(lengths) / len(lengths),
        samples=samples,
    )
