"""The choice task's reward function (tests/support/choice_task.py), alone in a file with no imports: scoring
processes and Ray actors load it by path, with nothing of torch, transformers or the tests package."""


def first_is_a(completions: list[str], **kwargs) -> list[float]:
    """1.0 when the answer starts with ``a`` (TRL's signature)."""
    return [float(c[:1] == "a") for c in completions]


def first_is_a_step(completions: list[str], **kwargs) -> list[list[tuple[int, float]]]:
    """The same reward as a step ending at the answer's first character (its first token)."""
    return [[(1, float(c[:1] == "a"))] if c else [] for c in completions]


def step_past_the_end(completions: list[str], **kwargs) -> list[list[tuple[int, float]]]:
    """A broken step function: its one step ends after the answer's last character."""
    return [[(len(c) + 1, 1.0)] for c in completions]
