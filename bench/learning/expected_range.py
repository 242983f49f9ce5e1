"""The range `make demo` expects for each arm, from the alignment experiment's runs on every kernel set measured.

    python -m bench.learning.expected_range bench/results/learning/critic_alignment_sft_models_avx512.json \
        bench/results/learning/critic_alignment_sft_models_avx2.json --out bench/results/learning/demo_expected.json

Per arm and metric (bench/learning/critic.py's EXPECTED_METRICS): a 95 % prediction interval for one more run, mean
+- t_{n-1} * sd * sqrt(1 + 1/n) over every run of the given tables (all SFT models, PPO seeds and kernel sets
pooled, treated as independent draws), clipped to what the metric can take ([0, 1] for accuracies) and widened to
every measured run where the spread is skewed (an arm that usually recovers and sometimes does not). A user's
machine trains its own SFT model, which lands where its kernels take it, so the demo's one run is compared with the
spread of runs over SFT models, not with one machine's figures. Pooling runs that share an SFT model understates
that spread somewhat; the observed minimum and maximum are written beside the interval. """

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from bench.common.record import command_line, write_record
from bench.common.stats import T_975
from bench.learning.critic import EXPECTED_METRICS

BOUNDS = {"accuracy_best": (0.0, 1.0), "accuracy_final": (0.0, 1.0), "decision_token_advantage": (0.0, math.inf)}


def prediction_interval(values: list[float], bounds: tuple[float, float]) -> tuple[float, float]:
    """95 % prediction interval for one more draw (Student t, n >= 2), clipped to ``bounds``."""
    n = len(values)
    if n < 2:
        raise ValueError("a prediction interval needs at least 2 runs")
    half = T_975[min(n - 1, len(T_975)) - 1] * statistics.stdev(values) * math.sqrt(1 + 1 / n)
    mean = statistics.fmean(values)
    return max(bounds[0], mean - half), min(bounds[1], mean + half)


def expected_ranges(tables: list[dict]) -> dict:
    """{arm: {metric: [low, high]}} and the runs behind each, from bench/learning/critic.py alignment tables."""
    runs = [run for table in tables for run in table["runs"]]
    arms: dict = {}
    observed: dict = {}
    for arm in dict.fromkeys(r["arm"] for r in runs):
        arm_runs = [r for r in runs if r["arm"] == arm]
        arms[arm], observed[arm] = {}, {}
        for metric in EXPECTED_METRICS:
            values = [r["result"][metric] for r in arm_runs if r["result"].get(metric) is not None]
            if len(values) >= 2:
                low, high = prediction_interval(values, BOUNDS[metric])
                # A skewed spread (an arm that usually recovers, sometimes not) has runs outside the normal-theory
                # interval: the range always covers every measured run.
                arms[arm][metric] = [min(low, min(values)), max(high, max(values))]
                observed[arm][metric] = {
                    "n": len(values),
                    "min": min(values),
                    "max": max(values),
                    "mean": statistics.fmean(values),
                }
    return {"arms": arms, "observed": observed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tables", nargs="+", help="bench/learning/critic.py alignment JSON files (one per kernel set)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    tables = [json.loads(Path(path).read_text()) for path in args.tables]
    ranges = expected_ranges(tables)
    n = sum(len(t["runs"]) for t in tables)
    names = ", ".join(Path(path).name for path in args.tables)
    out = {
        "source": f"95 % prediction interval for one run, widened to every measured run, from {n} runs in {names}; "
        "docs/learning.md",
        "command": command_line(),
        **ranges,
    }
    write_record(args.out, out, out["command"])
    for arm, metrics in ranges["arms"].items():
        for metric, (low, high) in metrics.items():
            seen = ranges["observed"][arm][metric]
            print(
                f"{arm:<8} {metric:<26} [{low:.3f}, {high:.3f}]  (n {seen['n']}, observed {seen['min']:.3f}"
                f"-{seen['max']:.3f})"
            )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
