"""The tables the command line prints: a title over aligned rows, and the closing results of a PPO run (accuracy
before and after, the critic's fit, the step time), each row only where it was measured."""

from __future__ import annotations

from dtppo.observability.logger import explained_var_defined, explained_var_mean, read_metrics


def table(title: str, values: dict) -> str:
    width = max(len(k) for k in values)
    lines = [f"{title}", "-" * (width + 14)]
    lines += [
        f"{k:<{width}}  {v:>10.4f}" if isinstance(v, float) else f"{k:<{width}}  {v:>10}" for k, v in values.items()
    ]
    return "\n".join(lines)


def results_table(log_dir: str, sft_results: dict, history: list[dict], reward_is_the_figure: bool = False) -> str:
    """The demo's summary from the metrics under ``log_dir``: accuracy before (when step 0 was validated) and after
    PPO and the critic's fit over the run; the validation reward too when ``reward_is_the_figure`` (a task without
    a verifier, whose accuracy means nothing)."""
    records = read_metrics(log_dir)
    val = [(r["step"], r["validation/accuracy"]) for r in records if "validation/accuracy" in r]
    val_reward = [(r["step"], r["validation/reward"]) for r in records if "validation/reward" in r]
    ev = [
        (r["step"], r["train/critic/explained_var"] if explained_var_defined(r) else "n/a")
        for r in records
        if "train/critic/explained_var" in r
    ]
    rows = dict(sft_results) | _start_and_end("validation accuracy", val)
    if val:
        if val[0][0] == 0 and val[-1][0] > 0:
            rows["PPO gain (points)"] = 100 * (val[-1][1] - val[0][1])
        rows["best validation accuracy"] = max(a for _, a in val)
    if reward_is_the_figure:
        rows |= _start_and_end("validation reward", val_reward)
    if ev:
        late, constant = explained_var_mean(records, after_step=ev[-1][0] / 2)
        rows["critic explained variance, first step"] = ev[0][1]
        rows["critic explained variance, mean of last half"] = "n/a" if late is None else late
        if constant:
            rows["last-half steps with constant returns (EV undefined, left out)"] = constant
    if history:
        rows["mean PPO step time (s)"] = sum(h["timing/step"] for h in history) / len(history)
    return table("dtppo results", rows)


def _start_and_end(name: str, measured: list[tuple[int, float]]) -> dict[str, float]:
    """The first and last of ``measured`` (step, value), each labelled by its step: "at start" only for a value
    measured at step 0 (none with ``ppo.validation.at_start=false``), "at end" only after it."""
    rows = {f"{name} at start (step 0)": measured[0][1]} if measured and measured[0][0] == 0 else {}
    if measured and measured[-1][0] > 0:
        rows[f"{name} at end (step {measured[-1][0]})"] = measured[-1][1]
    return rows
