"""Reward-function specs as a recipe writes them: a built-in name, ``path/to/file.py:name``, ``package.module:name``,
or the name of a function given in Python (``dtppo.PPOTrainer(reward_funcs=...)``).

Pure parsing (no imports): recipe notation, checked when the config is built (``RewardConfig``) and loaded by
``dtppo.rewards.functions``. ``BUILTINS`` is the one list of built-in verifier names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ANSWER_VERIFIERS = ("gsm8k", "math")  # an outcome from the final answer, read at a response's end
STEP_VERIFIERS = ("arithmetic_steps", "arithmetic_first_error")  # steps, from every line of a response
BUILTINS = ANSWER_VERIFIERS + STEP_VERIFIERS
MODEL_NAME = "model"  # the learned reward model's metric name (train/reward/model): no function may take it
PROCESS_MODEL_NAME = "process_model"  # the process reward model's (train/reward/process_model)
# How a chunk of samples can fail to be scored (rewards.failures); each is counted as train/reward/<kind>_chunks.
FAILURE_KINDS = ("crashed", "timed_out", "raised", "out_of_memory")
FAILED_SAMPLES_NAME = "failed_samples"  # train/reward/failed_samples: the samples of the failed chunks
# Metric names dtppo logs under train/reward/ itself: no reward function may take one.
RESERVED_NAMES = (MODEL_NAME, PROCESS_MODEL_NAME, *(f"{kind}_chunks" for kind in FAILURE_KINDS), FAILED_SAMPLES_NAME)


@dataclass(frozen=True)
class FunctionSpec:
    """kind: where the callable lives ("given": passed in Python, found by its name among those given); target: the
    file path or module name (a built-in or a given function: its name); attribute: the callable's name there, which
    is also its metric name (``train/reward/<name>``)."""

    text: str
    kind: Literal["builtin", "given", "file", "module"]
    target: str
    attribute: str

    @property
    def name(self) -> str:
        return self.attribute

    def absolute(self) -> str:
        """The spec with a file path made absolute: scoring processes and Ray actors may run elsewhere."""
        if self.kind != "file":
            return self.text
        return f"{Path(self.target).resolve()}:{self.attribute}"


def parse_spec(text: str) -> FunctionSpec:
    """The spec ``text`` names; ValueError says what is wrong with a malformed one."""
    if text in BUILTINS:
        return FunctionSpec(text, "builtin", text, text)
    if text.isidentifier():  # whether a function of that name was given is known where functions load
        return FunctionSpec(text, "given", text, text)
    target, sep, attribute = text.rpartition(":")
    if not sep or not target or not attribute:
        raise ValueError(
            f"{text!r} is neither a built-in ({', '.join(BUILTINS)}), path/to/file.py:name, package.module:name "
            "nor the name of a function given in Python"
        )
    if not attribute.isidentifier():
        raise ValueError(f"{text!r}: {attribute!r} is not a Python name")
    if target.endswith(".py") or "/" in target or "\\" in target:
        return FunctionSpec(text, "file", target, attribute)
    if not all(part.isidentifier() for part in target.split(".")):
        raise ValueError(f"{text!r}: {target!r} is not a module name (a file must end in .py)")
    return FunctionSpec(text, "module", target, attribute)
