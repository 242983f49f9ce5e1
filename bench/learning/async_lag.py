"""The critic under lag (docs/measurements/2026-12-02-critic-under-lag.md): ``ppo.max_lag`` k in {0, 1, 2, 4} x
``value.target_correction`` in {none, vtrace} on the mixed recipe, one training rank and one generation rank, from
several SFT models. A batch's tokens depend on its prompts and its policy version only, so runs side by side change
no number. Beside the driver's figures, per run: the critic's loss and its explained variance against the outcome
returns (one yardstick whatever its targets: V-trace's bootstrap toward V raises the first, not this), means over
the last half of the steps, and the largest staleness. Paired: each lag against k = 0 without correction, and V-trace
against none at each lag."""

from __future__ import annotations

import statistics

from bench.learning.driver import Experiment, main, run_figures

LAGS = (0, 1, 2, 4)
SPLIT = [
    "cluster.workers_per_node=2",
    "cluster.generation_ranks=1",
    "loss.rollout_correction.importance_sampling=token",
]


def arm(lag: int, correction: str) -> str:
    return f"k{lag}-{correction}"


def figures(records: list[dict], run: dict) -> dict:
    result = run_figures(records, run)
    for metric, name in [("loss", "critic_loss"), ("explained_var_outcome", "outcome_explained_var")]:
        key = f"train/critic/{metric}"
        result[f"{name}_last_half_mean"] = statistics.fmean(
            r[key] for r in records if key in r and r["step"] > run["steps"] / 2
        )
    return result | {"staleness_max": max(r.get("train/staleness/max", 0.0) for r in records)}


SPECS = {
    "async_lag": Experiment(
        name="async_learning",
        question="the critic under lag: ppo.max_lag against V-trace targets, over SFT models",
        recipe="recipes/tiny-math-mixed-cpu.yaml",
        arms={
            arm(k, c): [*SPLIT, f"ppo.max_lag={k}", f"value.target_correction={c}"]
            for k in LAGS
            for c in ("none", "vtrace")
        },
        arm_fields={arm(k, c): {"lag": k, "target_correction": c} for k in LAGS for c in ("none", "vtrace")},
        metrics="""accuracy_best accuracy_final explained_var_last_half_mean critic_loss_last_half_mean
            outcome_explained_var_last_half_mean""".split(),
        figures=figures,
        pairs={
            "degradation": [(arm(k, "none"), arm(0, "none")) for k in LAGS if k],
            "recovery": [(arm(k, "vtrace"), arm(k, "none")) for k in LAGS],
        },
        sft_seeds=(0, 1, 2),
    ),
}

if __name__ == "__main__":
    main(SPECS)
