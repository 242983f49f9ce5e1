"""The tables the command line prints: a title over aligned rows, and the closing results of a PPO run (accuracy
before and after, the critic's fit, the step time; ``RunResults``), each row only where it was measured."""

from __future__ import annotations

from dataclasses import dataclass

from dtppo.observability.logger import explained_var_defined, explained_var_mean, read_metrics


def table(title: str, values: dict) -> str:
    width = max(len(k) for k in values)
    lines = [f"{title}", "-" * (width + 14)]
    lines += [
        f"{k:<{width}}  {v:>10.4f}" if isinstance(v, float) else f"{k:<{width}}  {v:>10}" for k, v in values.items()
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class RunResults:
    """A PPO run's figures, read from its metrics under ``logger.log_dir`` (what ``dtppo ppo``'s closing table shows;
    ``dtppo.PPOTrainer.train`` returns it). None where not measured: the start only when step 0 was validated, the end
    only after it; the critic's explained variance only with a critic, None where undefined (constant returns)."""

    sft: dict[str, float]
    """The SFT model's results (``sft/accuracy``, ...), empty when PPO did not start from one."""
    accuracy_start: float | None
    accuracy_end: float | None
    end_step: int | None
    """The step of the last validation (``accuracy_end``'s)."""
    best_accuracy: float | None
    reward_start: float | None
    reward_end: float | None
    critic_logged: bool
    explained_var_first: float | None
    explained_var_last_half: float | None
    constant_return_steps: int
    """Steps of the last half whose returns were constant (EV undefined, left out of its mean)."""
    mean_step_seconds: float | None
    """The mean ``timing/step`` of the steps this process ran (not those before a resume)."""
    reward_is_the_figure: bool = False
    """A task without a verifier, whose accuracy means nothing: the table shows the validation reward."""

    @property
    def gain_points(self) -> float | None:
        """The PPO gain in accuracy points, end minus start (both measured)."""
        if self.accuracy_start is None or self.accuracy_end is None:
            return None
        return 100 * (self.accuracy_end - self.accuracy_start)

    def table(self) -> str:
        rows: dict = dict(self.sft)
        rows |= _start_and_end("validation accuracy", self.accuracy_start, self.accuracy_end, self.end_step)
        if self.gain_points is not None:
            rows["PPO gain (points)"] = self.gain_points
        if self.best_accuracy is not None:
            rows["best validation accuracy"] = self.best_accuracy
        if self.reward_is_the_figure:
            rows |= _start_and_end("validation reward", self.reward_start, self.reward_end, self.end_step)
        if self.critic_logged:
            first, late = self.explained_var_first, self.explained_var_last_half
            rows["critic explained variance, first step"] = "n/a" if first is None else first
            rows["critic explained variance, mean of last half"] = "n/a" if late is None else late
            if self.constant_return_steps:
                rows["last-half steps with constant returns (EV undefined, left out)"] = self.constant_return_steps
        if self.mean_step_seconds is not None:
            rows["mean PPO step time (s)"] = self.mean_step_seconds
        return table("dtppo results", rows)


def run_results(log_dir: str, sft_results: dict, history: list[dict], reward_is_the_figure: bool = False) -> RunResults:
    """The figures of the run whose metrics are under ``log_dir``; ``history``: the steps this process ran."""
    records = read_metrics(log_dir)
    val = [(r["step"], r["validation/accuracy"]) for r in records if "validation/accuracy" in r]
    val_reward = [(r["step"], r["validation/reward"]) for r in records if "validation/reward" in r]
    ev = [r for r in records if "train/critic/explained_var" in r]
    late, constant = explained_var_mean(records, after_step=ev[-1]["step"] / 2) if ev else (None, 0)
    first_ev = ev[0]["train/critic/explained_var"] if ev and explained_var_defined(ev[0]) else None
    end_step = next((step for step, _ in reversed(val or val_reward) if step > 0), None)
    return RunResults(
        sft=dict(sft_results),
        accuracy_start=_at_start(val),
        accuracy_end=_at_end(val),
        end_step=end_step,
        best_accuracy=max(a for _, a in val) if val else None,
        reward_start=_at_start(val_reward),
        reward_end=_at_end(val_reward),
        critic_logged=bool(ev),
        explained_var_first=first_ev,
        explained_var_last_half=late,
        constant_return_steps=constant,
        mean_step_seconds=sum(h["timing/step"] for h in history) / len(history) if history else None,
        reward_is_the_figure=reward_is_the_figure,
    )


def results_table(log_dir: str, sft_results: dict, history: list[dict], reward_is_the_figure: bool = False) -> str:
    """The closing table of the run under ``log_dir`` (``run_results``)."""
    return run_results(log_dir, sft_results, history, reward_is_the_figure).table()


def _at_start(measured: list[tuple[int, float]]) -> float | None:
    """The value measured at step 0 (none with ``ppo.validation.at_start=false``)."""
    return measured[0][1] if measured and measured[0][0] == 0 else None


def _at_end(measured: list[tuple[int, float]]) -> float | None:
    return measured[-1][1] if measured and measured[-1][0] > 0 else None


def _start_and_end(name: str, start: float | None, end: float | None, end_step: int | None) -> dict[str, float]:
    """Each of ``start`` and ``end`` that was measured, labelled by its step."""
    rows = {f"{name} at start (step 0)": start} if start is not None else {}
    if end is not None:
        rows[f"{name} at end (step {end_step})"] = end
    return rows
