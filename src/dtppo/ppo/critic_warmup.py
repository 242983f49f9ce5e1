"""The critic's warmup: the steps at the start of a run where only the critic trains. Either a fixed number
(``value.warmup.steps``) or until the critic has learned (``value.warmup.until_ev``): the mean of its
explained variance on fresh rollouts over the last ``value.warmup.ev_window`` steps, capped at
``value.warmup.max_steps`` critic-only steps."""

from __future__ import annotations

import torch

from dtppo.algorithms.losses import EV_MIN_RETURNS_VAR, explained_var
from dtppo.config import WarmupConfig
from dtppo.distributed.comm import is_main_rank
from dtppo.ops import masked_var
from dtppo.types import Experience


def critic_fit(experience: Experience) -> dict[str, torch.Tensor]:
    """The critic's fit to the batch's returns before its update, over the samples that train: ``returns_var``
    (0 when every sample got the same reward: the EV is then undefined, ``observability.logger.explained_var_mean``)
    and ``explained_var``. Needs ``returns`` and ``old_values``."""
    mask = experience.train_mask
    return {
        "returns_var": masked_var(experience.returns, mask, unbiased=False),
        "explained_var": explained_var(experience.returns, experience.old_values, mask),
    }


def defined_ev(fit: dict[str, torch.Tensor]) -> float | None:
    """``fit``'s explained variance (:func:`critic_fit`), None where it is undefined (returns that do not vary)
    or there is no critic (``fit`` empty)."""
    return float(fit["explained_var"]) if fit and float(fit["returns_var"]) > EV_MIN_RETURNS_VAR else None


class CriticWarmup:
    """Decides, once per step and identically on every rank (the EV is computed from the batch every rank holds),
    whether the policy trains. The state (the EVs seen, the step the warmup ended) is checkpointed."""

    def __init__(self, warmup: WarmupConfig):
        self.threshold, self.window, self.cap = warmup.until_ev, warmup.ev_window, warmup.max_steps
        self.history: list[float] = []  # the EV of each warmup step whose returns varied
        # The first step at which the policy trains: known from the start for a fixed warmup.
        self.ended_at: int | None = None if self.threshold is not None else warmup.steps

    def policy_trains(self, step: int, explained_var: float | None) -> bool:
        """Whether the policy trains at ``step`` (0-based); ``explained_var``: the critic's EV on this step's batch,
        before its update, or None when the batch's returns are all equal (nothing to explain)."""
        if self.ended_at is None:
            if explained_var is not None:
                self.history.append(explained_var)
            window_ev = self.window_ev()
            if window_ev is not None and window_ev >= self.threshold:
                self._end(
                    step,
                    f"explained variance {window_ev:.3f} over the last {self.window} steps >= "
                    f"value.warmup.until_ev = {self.threshold}",
                )
            elif step >= self.cap:
                shown = "undefined" if window_ev is None else f"{window_ev:.3f}"
                self._end(
                    step,
                    f"value.warmup.max_steps = {self.cap} reached (explained variance {shown} over "
                    f"the last {self.window} steps, value.warmup.until_ev = {self.threshold})",
                )
        return self.ended_at is not None and step >= self.ended_at

    def window_ev(self) -> float | None:
        """The mean EV of the last ``window`` warmup steps, None before there are that many."""
        if len(self.history) < self.window:
            return None
        return sum(self.history[-self.window :]) / self.window

    def _end(self, step: int, why: str) -> None:
        self.ended_at = step
        if is_main_rank():
            print(f"critic warmup over after {step} critic-only step(s): {why}", flush=True)

    def metrics(self, step: int) -> dict[str, float]:
        """``train/critic/warmup_steps``: critic-only steps up to ``step``; with ``value.warmup.until_ev``, the
        window's mean EV once there is one (``train/critic/warmup_window_ev``)."""
        done = step + 1 if self.ended_at is None else min(step + 1, self.ended_at)
        metrics = {"train/critic/warmup_steps": float(done)}
        if self.threshold is not None and self.window_ev() is not None:
            metrics["train/critic/warmup_window_ev"] = self.window_ev()
        return metrics

    def state_dict(self) -> dict:
        return {"history": list(self.history), "ended_at": self.ended_at}

    def load_state_dict(self, state: dict | None) -> None:
        if state is None:  # a checkpoint written before value.warmup.until_ev: the fixed warmup, as built
            return
        self.history = [float(x) for x in state["history"]]
        self.ended_at = None if state["ended_at"] is None else int(state["ended_at"])
