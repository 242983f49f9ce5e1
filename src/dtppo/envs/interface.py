"""What an environment is, and calling one safely: loading the class a spec names, resetting and stepping it, and
checking what it returns. No torch: environment processes import this module only (and the user's file).

An environment is a class built once per environment process with ``env.kwargs``::

    class Calculator:
        def reset(self, row: dict) -> state: ...
        def step(self, state, assistant_text: str) -> tuple[observation | None, float, bool]: ...

``row`` is the problem's columns as reward functions get them (``prompt``, ``answer`` and the rest);
``observation`` is text appended after the assistant's turn, or chat messages (e.g. ``[{"role": "tool", "content":
"444"}]``) rendered through the model's chat template; the reward is the turn's; ``done`` ends the episode. The state
travels with the episode (it is pickled between the trainer and the environment processes, which are its own
children), so any step may run in any process; a state the step changes in place is the one the next step gets.
Anything wrong (the class raises, returns the wrong shape, a non-finite reward, a late answer) is an
``EnvironmentFailure`` naming the environment and the sample: one line, never a silent 0.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from dtppo.config.reward_spec import parse_spec
from dtppo.data.problem import Problem
from dtppo.errors import InputError
from dtppo.usercode.loading import load_callable

Observation = str | list[dict[str, str]] | None
_PREVIEW = 60  # characters of a sample's text quoted in an error


class EnvironmentFailure(InputError):
    """An environment cannot be built, raised, returned something unusable or did not answer in time."""


def episode_row(problem: Problem) -> dict[str, Any]:
    """What ``reset`` gets: the prompt, the row's other columns and its reference answer (if the task has one)."""
    row = {"prompt": problem.question, **problem.columns}
    if problem.answer is not None:
        row["answer"] = problem.answer
    return row


def load_environment(spec: str, kwargs: dict[str, Any]) -> Any:
    """An instance of the class ``spec`` names, built with ``kwargs``; it must have ``reset`` and ``step``."""
    cls = load_callable(parse_spec(spec), "environment", EnvironmentFailure)
    try:
        env = cls(**kwargs)
    except Exception as err:  # the user's constructor: one line naming it
        raise EnvironmentFailure(
            f"environment {spec!r}: building it with {kwargs} raised {type(err).__name__}: {err}"
        ) from err
    for method in ("reset", "step"):
        if not callable(getattr(env, method, None)):
            raise EnvironmentFailure(f"environment {spec!r}: {type(env).__name__} has no {method}() method")
    return env


def run_job(spec: str, env: Any, job: tuple) -> tuple[str, Any]:
    """One job, in whichever process holds ``env``: ``("reset", ids, rows)`` -> ``("ok", states)``, or
    ``("step", ids, states, texts)`` -> ``("ok", [(state, observation, reward, done), ...])``; ``("error",
    message)`` when the environment failed (a pipe carries no exception). ``ids``: the samples' indices in their
    batch, for the message."""
    kind, ids = job[0], job[1]
    out: list[Any] = []
    items = job[2] if kind == "reset" else list(zip(job[2], job[3]))
    for i, item in enumerate(items):
        where = f"sample {ids[i]}"
        try:
            if kind == "reset":
                out.append(env.reset(item))
                continue
            state, text = item
            result = env.step(state, text)
        except Exception as err:  # the user's code: reported with the environment's name and the sample
            limit = " (out of memory: env.memory_limit_mib)" if isinstance(err, MemoryError) else ""
            return "error", f"environment {spec!r}: {kind} raised {type(err).__name__}: {err}{limit} ({where})"
        try:
            out.append((state, *checked_step(result)))
        except ValueError as err:
            return "error", f"environment {spec!r}: step returned {err} ({where}, after {text[-_PREVIEW:]!r})"
    return "ok", out


def checked_step(result: Any) -> tuple[Observation, float, bool]:
    """``(observation, reward, done)`` as a step must return it; ValueError says what is wrong otherwise."""
    if not isinstance(result, tuple) or len(result) != 3:
        raise ValueError(f"{result!r:.{_PREVIEW}}, not a tuple (observation, reward, done)")
    observation, reward, done = result
    if not _is_observation(observation):
        raise ValueError(
            f"observation {observation!r:.{_PREVIEW}} ({type(observation).__name__}), not None, text or a list of "
            f"{{'role': ..., 'content': ...}} messages"
        )
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
        raise ValueError(f"reward {reward!r:.{_PREVIEW}} ({type(reward).__name__}), not a finite number")
    numpy_bool = type(done).__module__ == "numpy" and type(done).__name__ in ("bool", "bool_")  # 2.x and 1.x
    if not isinstance(done, bool) and not numpy_bool:  # numpy's bool too
        raise ValueError(f"done {done!r:.{_PREVIEW}} ({type(done).__name__}), not a bool")
    return observation, float(reward), bool(done)


def _is_observation(observation: Any) -> bool:
    if observation is None or isinstance(observation, str):
        return True
    return isinstance(observation, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in observation
    )
