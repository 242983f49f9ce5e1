"""Statistics of the learning experiments: means with Student-t 95 % intervals over the units of replication (seeds or
SFT models), paired differences by SFT model, and the table cell that shows them."""

from __future__ import annotations

import math
import statistics

# Two-sided 95 % critical values of Student's t, t_{0.975, df} for df = 1..30 (any t table; checked against a
# numerical integral of the t density in tests/repo/test_bench_critic.py). Beyond 30 the df-30 value is used:
# slightly wider than exact, never narrower.
T_975 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
]


def mean_ci95(values: list[float]) -> dict:
    """Mean and 95 % t-interval over seeds; a single value has no interval (None bounds)."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return {"n": n, "mean": mean, "ci95_low": None, "ci95_high": None}
    half = T_975[min(n - 1, len(T_975)) - 1] * statistics.stdev(values) / math.sqrt(n)
    return {"n": n, "mean": mean, "ci95_low": mean - half, "ci95_high": mean + half}


def per_sft_model(runs: list[dict], arm: str, metric: str) -> dict[int, float]:
    """``metric`` of each run of ``arm``, by its SFT model (runs: dicts with ``arm``, ``sft_seed``, ``result``)."""
    return {r["sft_seed"]: r["result"][metric] for r in runs if r["arm"] == arm}


def paired_ci95(runs: list[dict], first: str, second: str, metric: str) -> dict:
    """Mean and 95 % t-interval of ``first`` − ``second`` in ``metric``, paired by SFT model."""
    a, b = per_sft_model(runs, first, metric), per_sft_model(runs, second, metric)
    return mean_ci95([a[k] - b[k] for k in sorted(a.keys() & b.keys())])


def ci_cell(s: dict, excludes_zero_mark: bool = False) -> str:
    """``mean [low, high]`` of a ``mean_ci95`` result; with the mark, ``*`` when the interval excludes 0."""
    if s["ci95_low"] is None:
        return f"{s['mean']:.3f}"
    mark = "*" if excludes_zero_mark and (s["ci95_low"] > 0 or s["ci95_high"] < 0) else " " * excludes_zero_mark
    return f"{s['mean']:+.3f} [{s['ci95_low']:+.3f}, {s['ci95_high']:+.3f}]{mark}"
