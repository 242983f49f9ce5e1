"""Reward functions for the number task (examples/number-task.yaml), written in TRL's GRPOTrainer style.

dtppo calls each as ``fn(prompts=[...], completions=[...], **columns)``: the dataset's columns (here
``threshold`` and ``topic``) arrive as keyword lists, one entry per sample. A function returns one float per
sample, or None where it does not apply (0 in the total, left out of its mean in train/reward/<name>).
"""

import re

_LEADING_NUMBER = re.compile(r"\s*(-?\d{1,12})")


def digit_share(completions, **kwargs):
    """Partial credit, as TRL's documented examples write it: the share of the completion that is digits."""
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


def bigger_number(prompts, completions, threshold, **kwargs):
    """1.0 when the completion starts with a number above the row's threshold, 0.0 when below; None (not
    applicable) when it does not start with a number."""
    scores = []
    for text, limit in zip(completions, threshold):
        match = _LEADING_NUMBER.match(text)
        scores.append(None if match is None else float(int(match.group(1)) > limit))
    return scores
