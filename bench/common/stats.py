"""Statistics of the learning experiments: means with Student-t 95 % intervals over the units of replication (the SFT
models where runs start from several, else the PPO seeds), paired differences unit by unit, and the table cell."""

from __future__ import annotations

import math
import statistics

# Two-sided 95 % critical values of Student's t, t_{0.975, df} for df = 1..30 (any t table; checked against a
# numerical integral of the t density in tests/repo/test_bench_critic.py). Beyond 30 the df-30 value is used:
# slightly wider than exact, never narrower.
T_975 = [
    float(t)
    for t in """12.706 4.303 3.182 2.776 2.571 2.447 2.365 2.306 2.262 2.228 2.201 2.179 2.160 2.145 2.131 2.120 2.110
    2.101 2.093 2.086 2.080 2.074 2.069 2.064 2.060 2.056 2.052 2.048 2.045 2.042""".split()
]


def mean_ci95(values: list[float]) -> dict:
    """Mean and 95 % t-interval; a single value has no interval (None bounds)."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return {"n": n, "mean": mean, "ci95_low": None, "ci95_high": None}
    half = T_975[min(n - 1, len(T_975)) - 1] * statistics.stdev(values) / math.sqrt(n)
    return {"n": n, "mean": mean, "ci95_low": mean - half, "ci95_high": mean + half}


def unit_values(runs: list[dict], arm: str, metric: str) -> dict[int, float] | None:
    """``metric`` of ``arm`` per unit: per SFT model the mean over its PPO seeds, or per PPO seed when every run
    starts from one SFT model (runs: dicts with ``arm``, ``sft_seed``, ``seed`` and ``result``). None when a run
    lacks the metric (GRPO has no critic)."""
    mine = [r for r in runs if r["arm"] == arm]
    if not mine or any(r["result"].get(metric) is None for r in mine):
        return None
    if len({r["sft_seed"] for r in mine}) == 1:
        return {r.get("seed", 0): r["result"][metric] for r in mine}
    by_model: dict[int, list[float]] = {}
    for r in mine:
        by_model.setdefault(r["sft_seed"], []).append(r["result"][metric])
    return {model: statistics.fmean(values) for model, values in by_model.items()}


def per_arm(runs: list[dict], arms: list[str], metrics: list[str]) -> dict[str, dict[str, dict]]:
    """Each arm's :func:`mean_ci95` over its units, per metric it has."""
    return {
        arm: {m: mean_ci95(list(units.values())) for m in metrics if (units := unit_values(runs, arm, m))}
        for arm in arms
    }


def paired(runs: list[dict], first: str, second: str, metrics: list[str]) -> dict[str, dict]:
    """Mean and 95 % t-interval of ``first`` − ``second`` per metric, unit by unit over the units both have."""
    out = {}
    for metric in metrics:
        a, b = unit_values(runs, first, metric), unit_values(runs, second, metric)
        if a and b and (common := sorted(a.keys() & b.keys())):
            out[metric] = mean_ci95([a[k] - b[k] for k in common])
    return out


def ci_cell(s: dict, excludes_zero_mark: bool = False) -> str:
    """``mean [low, high]`` of a ``mean_ci95`` result; with the mark, ``*`` when the interval excludes 0."""
    if s["ci95_low"] is None:
        return f"{s['mean']:.3f}"
    mark = "*" if excludes_zero_mark and (s["ci95_low"] > 0 or s["ci95_high"] < 0) else " " * excludes_zero_mark
    return f"{s['mean']:+.3f} [{s['ci95_low']:+.3f}, {s['ci95_high']:+.3f}]{mark}"
