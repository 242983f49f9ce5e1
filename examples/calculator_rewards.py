"""Accuracy on each half of the calculator task, as reward functions with weight 0 (logged, not rewarded): 1.0 for
a right final answer on a problem of that half, None (not applicable, left out of the mean) on the other half, so
``train/reward/hard_half`` and ``validation/reward/hard_half`` are the hard half's accuracy."""

from dtppo.rewards.verifiers.gsm8k import gsm8k_reward


def _half(completions, answer, hard, want_hard):
    return [
        gsm8k_reward(c, str(a).rsplit("####", 1)[-1].strip()) if h == want_hard else None
        for c, a, h in zip(completions, answer, hard)
    ]


def hard_half(prompts, completions, answer, hard, **columns):
    return _half(completions, answer, hard, True)


def easy_half(prompts, completions, answer, hard, **columns):
    return _half(completions, answer, hard, False)
