"""The test hooks that provoke faults on purpose (the errors they lead to are in ``dtppo.errors``).

Test hooks are environment variables, so they reach every rank a launcher starts and need no config key.
They are read when used and do nothing when unset (the normal case):

- ``DTPPO_TEST_NONFINITE="policy:3,4;value:0"``: the loss of those optimizer steps (0-based, counted over
  the whole run per model, as the LR schedule counts them) is multiplied by NaN before ``backward()``, so
  the loss and the gradient are non-finite exactly as after a real overflow.
- ``DTPPO_TEST_PAUSE_IN_CHECKPOINT=SECONDS``: a checkpoint write sleeps this long after each of its 4 stages
  (directory created, weights written, trainer state written, manifest written: just before the rename), so
  a kill inside the write is easy to hit.
- ``DTPPO_TEST_VALUE_GRAD=off|flip``: the critic's loss keeps its value but its gradient is multiplied by 0
  (the critic never learns) or -1 (it climbs the loss): the learning test's negative control for the critic.
- ``DTPPO_TEST_GEN_LOGPROB_ERROR=DELTA``: the log-probs the generator recorded for training sample i are
  lowered by ``DELTA·(i mod 3)`` on every response token, as a generator whose numerics differ from the
  trainer's would report them (π_old/π_gen = exp(DELTA·(i mod 3)) per token): the mismatch correction's test.
- ``DTPPO_TEST_OBSERVATIONS_AS_ACTIONS=1``: episodes' observation tokens are marked as the policy's own
  (``response_mask`` 1, generation log-prob 0), so they are trained on and valued as actions, the masking bug
  peers had: the multi-turn experiment's ablation (docs/measurements/2026-12-02-tools-with-a-critic.md).
- ``DTPPO_TEST_LEARNING_FAULT=drop_rewards|zero_advantages``: GAE sees token rewards of 0 (the reward never reaches
  the returns), or every advantage is set to 0 after GAE (the policy gets no signal): the learning gate's negative
  controls (tests/functional/test_learning_gate.py).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # scoring and environment processes import this module; they must not load torch (seconds, MiBs)
    import torch

NONFINITE_ENV = "DTPPO_TEST_NONFINITE"
PAUSE_ENV = "DTPPO_TEST_PAUSE_IN_CHECKPOINT"
VALUE_GRAD_ENV = "DTPPO_TEST_VALUE_GRAD"
GEN_LOGPROB_ERROR_ENV = "DTPPO_TEST_GEN_LOGPROB_ERROR"
OBSERVATIONS_AS_ACTIONS_ENV = "DTPPO_TEST_OBSERVATIONS_AS_ACTIONS"
LEARNING_FAULT_ENV = "DTPPO_TEST_LEARNING_FAULT"
_LEARNING_FAULTS = ("", "drop_rewards", "zero_advantages")
_VALUE_GRAD_SCALES = {"": 1.0, "off": 0.0, "flip": -1.0}


def nonfinite_injected(model: str, optimizer_step: int) -> bool:
    """True when ``DTPPO_TEST_NONFINITE`` lists ``optimizer_step`` for ``model`` ("policy" / "value")."""
    spec = os.environ.get(NONFINITE_ENV, "").strip()
    if not spec:
        return False
    for part in spec.split(";"):
        name, _, steps = part.partition(":")
        if name.strip() == model and str(optimizer_step) in {s.strip() for s in steps.split(",")}:
            return True
    return False


def pause_in_checkpoint() -> None:
    """Sleep ``DTPPO_TEST_PAUSE_IN_CHECKPOINT`` seconds (kill-campaign hook; no-op when unset)."""
    seconds = float(os.environ.get(PAUSE_ENV, "0") or 0)
    if seconds > 0:
        time.sleep(seconds)


def value_grad_scale() -> float:
    """The critic's gradient factor set by ``DTPPO_TEST_VALUE_GRAD``: 1 (unset), 0 (``off``), -1 (``flip``)."""
    spec = os.environ.get(VALUE_GRAD_ENV, "").strip()
    if spec not in _VALUE_GRAD_SCALES:
        raise ValueError(f"{VALUE_GRAD_ENV} must be off or flip, got {spec!r}")
    return _VALUE_GRAD_SCALES[spec]


def gen_logprob_error(num_samples: int) -> torch.Tensor | None:
    """[B] amounts ``DTPPO_TEST_GEN_LOGPROB_ERROR`` subtracts from each sample's generation log-probs; None unset."""
    spec = os.environ.get(GEN_LOGPROB_ERROR_ENV, "").strip()
    if not spec:
        return None
    import torch

    return float(spec) * (torch.arange(num_samples) % 3).float()


def observations_as_actions() -> bool:
    """Whether ``DTPPO_TEST_OBSERVATIONS_AS_ACTIONS`` asks episodes to mark observation tokens as actions."""
    return os.environ.get(OBSERVATIONS_AS_ACTIONS_ENV, "").strip() == "1"


def learning_fault() -> str:
    """The fault ``DTPPO_TEST_LEARNING_FAULT`` asks GAE to make: "" (none), "drop_rewards" or "zero_advantages"."""
    spec = os.environ.get(LEARNING_FAULT_ENV, "").strip()
    if spec not in _LEARNING_FAULTS:
        raise ValueError(f"{LEARNING_FAULT_ENV} must be drop_rewards or zero_advantages, got {spec!r}")
    return spec
