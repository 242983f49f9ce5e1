"""What the learning driver prints and draws: the two-arm table (the critic experiments, `make demo`, the README's
demo block), per-arm rows with sections of paired differences, each run against its arm's expected range, and every
run's curves."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from bench.common.stats import ci_cell
from dtppo.observability.plot import curve

# The figures `make demo` checks against bench/results/learning/demo_expected.json.
EXPECTED_METRICS = ["accuracy_best", "accuracy_final", "decision_token_advantage"]


def print_table(summary: dict) -> None:
    """One row per metric, one column per arm: mean [95 % CI]; with two arms, whether the intervals overlap."""
    arms = [arm for arm in summary if arm not in ("intervals_overlap", "paired_difference", "sft_models")]
    overlap = summary.get("intervals_overlap", {})
    n = {arm: max((s["n"] for s in summary[arm].values()), default=0) for arm in arms}
    print(
        f"\n{'metric':<30}"
        + "".join(f"{f'{arm} (n={n[arm]})':>28}" for arm in arms)
        + ("  CIs overlap" if overlap else "")
    )
    for metric in dict.fromkeys(m for arm in arms for m in summary[arm]):
        cells = []
        for arm in arms:
            s = summary[arm].get(metric)
            ci = "" if s is None or s["ci95_low"] is None else f" [{s['ci95_low']:.3f}, {s['ci95_high']:.3f}]"
            cells.append("-" if s is None else f"{s['mean']:.3f}{ci}")
        flag = {True: "yes", False: "no"}.get(overlap.get(metric), "")
        print(f"{metric:<30}" + "".join(f"{c:>28}" for c in cells) + (f"  {flag:>12}" if overlap else ""))
    paired = {m: s for m, s in summary.get("paired_difference", {}).items() if s["ci95_low"] is not None}
    if paired:
        print(f"\n{f'{arms[0]} - {arms[1]}, paired by unit':<30}{'mean [95 % CI]':>28}  CI excludes 0")
        for metric, s in paired.items():
            excludes = "yes" if s["ci95_low"] > 0 or s["ci95_high"] < 0 else "no"
            cell = f"{s['mean']:+.3f} [{s['ci95_low']:+.3f}, {s['ci95_high']:+.3f}]"
            print(f"{metric:<30}{cell:>28}  {excludes:>13}")


def print_sections(per_arm: dict, sections: dict[str, dict], metrics: list[str]) -> None:
    """Each arm's mean [95 % interval] per metric, then each section of paired differences (``*``: the interval
    excludes 0); a section holds named differences, or is one difference itself."""
    named = {t: {t: rows} if all("mean" in v for v in rows.values()) else rows for t, rows in sections.items()}
    width = 2 + max(len(name) for name in [*per_arm, *(n for rows in named.values() for n in rows)])

    def cells(figures: dict, mark: bool) -> str:
        return "".join(f"{ci_cell(figures[m], mark) if m in figures else '-':>{34 + mark}}" for m in metrics)

    print(f"\n{'arm':<{width}}" + "".join(f"{m:>34}" for m in metrics))
    for arm, figures in per_arm.items():
        print(f"{arm:<{width}}" + cells(figures, False))
    for title, rows in named.items():
        print(f"\n{title} (paired by unit; * = the 95 % interval excludes 0)")
        for name, figures in rows.items():
            print(f"{name:<{width}}" + cells(figures, True))


def expected_check(value: float, low: float, high: float) -> str:
    """``inside`` or ``OUTSIDE`` the closed range."""
    return "inside" if low <= value <= high else "OUTSIDE"


def print_expected(runs: list[dict], expected: dict) -> None:
    """Each run's figures against its arm's expected range (bench/results/learning/demo_expected.json)."""
    print(f"\nexpected on 2 CPU cores ({expected['source']}):")
    for r in runs:
        ranges = expected["arms"].get(r["arm"], {})
        for metric in EXPECTED_METRICS:
            if metric in ranges and r["result"].get(metric) is not None:
                low, high = ranges[metric]
                value = r["result"][metric]
                print(
                    f"  {r['arm']:<8} {metric:<26} {value:.3f}  expected [{low:.3f}, {high:.3f}]: "
                    f"{expected_check(value, low, high)}"
                )


def _nanmean(values: list[float]) -> float:
    """Mean of the values that are not NaN; NaN when none is."""
    kept = [v for v in values if not math.isnan(v)]
    return statistics.fmean(kept) if kept else math.nan


def plot_arms(runs: list[dict], records: list[list[dict]], out: Path) -> Path:
    """Validation accuracy and critic EV per step: each run a thin line, each arm's mean a thick one. Steps whose EV
    is undefined (constant returns) are gaps in a run's line and left out of the arm's mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    panels = [("validation/accuracy", "validation accuracy (greedy)"), ("train/critic/explained_var", "critic EV")]
    for color, arm in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], dict.fromkeys(r["arm"] for r in runs)):
        mine = [run_records for r, run_records in zip(runs, records) if r["arm"] == arm]
        for ax, (key, title) in zip(axes, panels):
            curves = [dict(curve(run_records, key)) for run_records in mine]
            steps = sorted(set().union(*curves))
            if not steps:
                continue
            for points in curves:
                ax.plot(steps, [points.get(s, math.nan) for s in steps], color=color, alpha=0.25, linewidth=0.8)
            means = [_nanmean([c.get(s, math.nan) for c in curves]) for s in steps]
            ax.plot(steps, means, color=color, linewidth=2, label=f"{arm} (mean of {len(curves)})")
            ax.set_title(title)
            ax.set_xlabel("PPO step")
    axes[1].set_ylim(max(axes[1].get_ylim()[0], -1.0), 1.0)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
