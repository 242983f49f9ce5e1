"""The choice task's reward function (tests/support/choice_task.py), alone in a file with no imports: scoring
processes and Ray actors load it by path, with nothing of torch, transformers or the tests package."""


def first_is_a(completions: list[str], **kwargs) -> list[float]:
    """1.0 when the answer starts with ``a`` (TRL's signature)."""
    return [float(c[:1] == "a") for c in completions]
