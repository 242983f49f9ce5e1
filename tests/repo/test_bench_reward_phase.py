"""The cost sentences of docs/guides/step-rewards.md, recomputed from bench/results/perf/reward_phase.json: the
range of each ratio over the record's repeats, so a rerun bench changes what the guide must say."""

import json

from bench.common.paths import PERF
from tests.support.recipes import REPO


def _range(row: dict) -> str:
    """The ratio's range over the repeats as the guide writes it: one figure when both ends round alike."""
    low, high = f"{min(row['ratio_repeats']):.2f}", f"{max(row['ratio_repeats']):.2f}"
    return f"{low}×" if low == high else f"{low}–{high}×"


def test_the_guide_states_the_record_s_ratios():
    rows = json.loads((PERF / "reward_phase.json").read_text())["rows"]
    guide = " ".join((REPO / "docs" / "guides" / "step-rewards.md").read_text().split())
    step = {row["workers"]: row for row in rows if row.get("against") == "outcome"}
    assert (
        f"costs {_range(step[2])} the outcome with the recipe's 2 scoring processes (median {step[2]['ratio']:.2f}), "
        f"{_range(step[1])} with one and {_range(step[0])} scored in-process"
    ) in guide
    scorer = [row for row in rows if row["arm"] == "verifier + arithmetic_steps"]
    low, high = min(min(r["ratio_repeats"]) for r in scorer), max(max(r["ratio_repeats"]) for r in scorer)
    assert f"costs {low:.1f}–{high:.1f}× the verifier alone" in guide
    overlap = {row["workers"]: row for row in rows if row.get("against") == "the same, measured after the scores"}
    assert f"{_range(overlap[1])} of the phase with them measured after the scores with one process" in guide
    assert f"and {_range(overlap[2])} with the recipe's two" in guide
    assert all(row["meets_goal"] == (row["ratio"] <= row["goal"]) for row in step.values())
