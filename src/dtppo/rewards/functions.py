"""Reward functions in TRL's convention: loading them from a spec, the built-in verifiers, and running them.

A reward function is called ``fn(prompts=[...], completions=[...], **columns) -> list[float | None | steps]``: one
entry per sample, each dataset column other than the prompt as a keyword list, and the row's reference (if the task
has one) as ``answer=``. ``None`` means "not applicable to this sample": 0 in the weighted sum, left out of that
function's mean. This is TRL's GRPOTrainer signature, so a function written for TRL (``def f(completions,
**kwargs)``) runs unchanged. An entry may instead reward the sample's steps: a list of ``(end, reward)`` pairs,
``end`` the character offset in the completion just after the step (``0 < end <= len(completion)``); the trainer
puts each on the token holding character ``end − 1``. Both forms may mix in one batch.

What a function returns is checked here, in the process that runs it (a scoring process, a Ray actor or rank 0):
the wrong length, a non-number, NaN or inf, a step end outside the completion is a ``RewardFunctionError`` naming
the function and the first bad sample, never a silent 0: the contract is broken on every call, so the run stops.
A function that raises (``FunctionRaised``) fails its chunk instead: a flaky sandbox or service does that now and
then, and the run stops only when failures pass ``reward.max_failed_fraction`` (``rewards.failures``). This module
imports no torch: scoring processes load it.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

from dtppo.config.reward_spec import parse_spec
from dtppo.errors import InputError
from dtppo.rewards.verifiers.gsm8k import gsm8k_reward
from dtppo.rewards.verifiers.math import math_reward
from dtppo.rewards.verifiers.steps import step_rewards
from dtppo.usercode.given import GivenInputs
from dtppo.usercode.loading import load_callable

RewardFunction = Callable[..., Sequence[Any]]
Steps = tuple[tuple[int, float], ...]  # (end, reward): a step's reward, placed after its last character
Score = float | None | Steps
Scores = list[Score]
_PREVIEW = 60  # characters of a bad sample's prompt quoted in an error


class RewardFunctionError(InputError):
    """A reward function cannot be loaded or called, or returned unusable scores; names the function."""


class FunctionRaised(RewardFunctionError):
    """A reward function raised on a chunk; ``kind`` is ``out_of_memory`` for a ``MemoryError`` (the scoring
    process's ``reward.memory_limit_mib``), else ``raised``; ``detail`` the exception in one line."""

    def __init__(self, message: str, kind: str, detail: str):
        super().__init__(message)
        self.kind, self.detail = kind, detail


def completion_text(completion: Any) -> str:
    """The generated text of a completion: itself, or the content of a conversational completion's last message."""
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return completion[-1].get("content", "")
    return completion if isinstance(completion, str) else ""


def reference_text(answer: Any) -> str:
    """A reference as the built-in verifiers read it: a string, or a number's decimal text (jsonl rows often hold
    ``"answer": 42``); anything else is "" (which no answer matches)."""
    if isinstance(answer, str):
        return answer
    return str(answer) if isinstance(answer, numbers.Real) and not isinstance(answer, bool) else ""


def gsm8k_function(prompts: list, completions: list, answer: list, **columns: list) -> list[float]:
    """1.0 where the completion's final answer equals ``answer`` numerically
    (``dtppo.rewards.verifiers.gsm8k.gsm8k_reward``)."""
    return [gsm8k_reward(completion_text(c), reference_text(a)) for c, a in zip(completions, answer)]


def math_function(prompts: list, completions: list, answer: list, **columns: list) -> list[float]:
    """1.0 where the completion's last ``\\boxed{}`` (or ``####`` answer) equals ``answer`` mathematically
    (``dtppo.rewards.verifiers.math.math_reward``)."""
    return [math_reward(completion_text(c), reference_text(a)) for c, a in zip(completions, answer)]


def arithmetic_steps_function(prompts: list, completions: list, **columns: list) -> list[Steps]:
    """Each correct ``a op b = c`` step of the completion rewarded at its end, 1/n for n steps found (a fully correct
    chain earns 1; ``dtppo.rewards.verifiers.steps``)."""
    return [tuple(step_rewards(completion_text(c), "per_step")) for c in completions]


def arithmetic_first_error_function(prompts: list, completions: list, **columns: list) -> list[Steps]:
    """−1 at the end of the completion's first wrong ``a op b = c`` step, nothing after it nor for a correct chain
    (``dtppo.rewards.verifiers.steps``)."""
    return [tuple(step_rewards(completion_text(c), "first_error")) for c in completions]


_BUILTIN_FUNCTIONS: dict[str, RewardFunction] = {
    "gsm8k": gsm8k_function,
    "math": math_function,
    "arithmetic_steps": arithmetic_steps_function,
    "arithmetic_first_error": arithmetic_first_error_function,
}


def reward_function(spec: str, given: GivenInputs | None = None) -> RewardFunction:
    """The callable ``spec`` names (a built-in, ``path/to/file.py:name``, ``package.module:name`` or the name of one
    of the ``given`` functions), through the loader the config uses. Raises ``RewardFunctionError`` for a malformed
    spec, a missing file or module, a missing name, or a name that is not callable."""
    try:
        parsed = parse_spec(spec)
    except ValueError as err:
        raise RewardFunctionError(f"reward function {err}") from None
    if parsed.kind == "builtin":
        return _BUILTIN_FUNCTIONS[parsed.name]
    if parsed.kind == "given":
        fn = given.function(parsed.name) if given is not None else None
        if fn is None:
            raise RewardFunctionError(
                f"reward function {spec!r} is neither a built-in ({', '.join(_BUILTIN_FUNCTIONS)}) nor a function "
                "given in Python (PPOTrainer(reward_funcs=...)); code in a file or module is named "
                "path/to/file.py:name or package.module:name"
            )
        return fn
    return load_callable(parsed, "reward function", RewardFunctionError)


def check_arguments(spec: str, fn: RewardFunction, available: Sequence[str]) -> None:
    """Every argument ``fn`` requires is one it will get (``prompts``, ``completions`` or a column in
    ``available``), so a missing column fails before the first step instead of at the first scoring."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a C callable without a signature: the call itself will tell
        return
    given = {"prompts", "completions", *available}
    for param in params:
        if param.default is not inspect.Parameter.empty or param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
            continue
        if param.kind is param.POSITIONAL_ONLY:
            raise RewardFunctionError(
                f"reward function {spec!r}: argument {param.name!r} is positional-only; "
                f"reward functions are called with keywords (prompts=, completions=, columns)"
            )
        if param.name not in given:
            raise RewardFunctionError(
                f"reward function {spec!r} needs a column {param.name!r} that the rows do not "
                f"have (it gets prompts, completions and {sorted(available)})"
            )


def call_function(
    spec: str, fn: RewardFunction, prompts: list, completions: list, columns: dict[str, list], offset: int = 0
) -> Scores:
    """``fn``'s checked scores for one chunk of samples; ``offset`` is the chunk's first sample in its batch, so an
    error names the sample by its place in the batch."""
    try:
        values = fn(prompts=prompts, completions=completions, **columns)
    except Exception as err:  # the user's code: reported with the function's name, never scored as 0
        detail, last = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__, offset + len(completions) - 1
        raise FunctionRaised(
            f"reward function {spec!r} raised {detail} (on a chunk of samples {offset}..{last})",
            "out_of_memory" if isinstance(err, MemoryError) else "raised",
            detail,
        ) from err
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()  # numpy arrays and tensors
    if not isinstance(values, (list, tuple)):
        raise RewardFunctionError(f"reward function {spec!r} returned a {type(values).__name__}, not a list of scores")
    if len(values) != len(completions):
        raise RewardFunctionError(
            f"reward function {spec!r} returned {len(values)} scores for {len(completions)} samples"
        )
    return [_checked(spec, value, offset + i, prompts[i], completions[i]) for i, value in enumerate(values)]


def _checked(spec: str, value: Any, index: int, prompt: Any, completion: Any) -> Score:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        steps, problem = _checked_steps(value, len(completion_text(completion)))
        if problem is None:
            return steps
    elif not isinstance(value, numbers.Real):
        problem = f"{value!r:.{_PREVIEW}} ({type(value).__name__}), not a number, None or a list of (end, reward)"
    elif not math.isfinite(float(value)):
        problem = f"{float(value)}"
    else:
        return float(value)
    raise RewardFunctionError(
        f"reward function {spec!r} returned {problem} for sample {index} (prompt {str(prompt)[:_PREVIEW]!r})"
    )


def _checked_steps(value: Sequence[Any], length: int) -> tuple[Steps, str | None]:
    """(the pairs as ints and floats, None), or ((), what is wrong with the first bad pair)."""
    steps = []
    for pair in value:
        # Python's own ints and floats skip the abstract checks (a step per line of every answer adds up)
        if type(pair) in (tuple, list) and len(pair) == 2:
            end, reward = pair
            if type(end) is int and type(reward) in (float, int) and 0 < end <= length and math.isfinite(reward):
                steps.append((end, float(reward)))
                continue
        problem = _step_problem(pair, length)
        if problem is not None:
            return (), problem
        steps.append((int(pair[0]), float(pair[1])))
    return tuple(steps), None


def _step_problem(pair: Any, length: int) -> str | None:
    """What is wrong with one (end, reward) pair of any number types (numpy's, ``Fraction``), or None."""
    if not isinstance(pair, (list, tuple)) or len(pair) != 2:
        return f"a step {pair!r:.{_PREVIEW}}, not an (end, reward) pair"
    end, reward = pair
    if isinstance(end, bool) or not isinstance(end, numbers.Integral):
        return f"a step end {end!r:.{_PREVIEW}} ({type(end).__name__}), not an integer"
    if not 0 < end <= length:
        return f"a step end {end} outside (0, {length}], the completion's characters"
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
        return f"a step reward {reward!r:.{_PREVIEW}}, not a finite number"
    return None


def load_functions(specs: Sequence[str], given: GivenInputs | None = None) -> list[tuple[str, RewardFunction]]:
    """(spec, callable) for each spec, in order (``given``: the functions passed in Python, by name)."""
    return [(spec, reward_function(spec, given)) for spec in specs]


def score_job(
    functions: list[tuple[str, RewardFunction]], job: tuple, announce: Callable[[str], None] | None = None
) -> tuple[str, Any]:
    """One chunk ``(offset, prompts, completions, columns)``: ``("scores", [scores per function])``; ``("failed",
    (kind, spec, detail))`` for a function that raised (``FunctionRaised``: the chunk fails, the run goes on);
    ``("error", message)`` for unusable scores (the parent raises it: a pipe carries no exception). ``announce``
    is told each function's spec before it runs (a crash is then named by the function it happened in)."""
    offset, prompts, completions, columns = job
    scores = []
    for spec, fn in functions:
        if announce is not None:
            announce(spec)
        try:
            scores.append(call_function(spec, fn, prompts, completions, columns, offset))
        except FunctionRaised as err:
            return "failed", (err.kind, spec, err.detail)
        except RewardFunctionError as err:
            return "error", str(err)
    return "scores", scores
