"""Tools with a critic (docs/measurements/2026-12-02-tools-with-a-critic.md): PPO on the calculator task with the
tool, without it, and with the observation tokens wrongly trained on and valued as actions (a planted fault), from
several SFT models; the task's data first: ``python examples/make_calculator_task.py runs/calculator-task``. Beside
the driver's figures, per run: the hard half's validation accuracy (best, at the start, final), the easy half's
best, tool calls and turns per episode and the critic's explained variance over the last half of the steps."""

from __future__ import annotations

import statistics

from bench.learning.driver import Experiment, main, run_figures
from dtppo.faults import OBSERVATIONS_AS_ACTIONS_ENV


def curve(records: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in records if key in r]


def figures(records: list[dict], run: dict) -> dict:
    hard, easy = curve(records, "validation/reward/hard_half"), curve(records, "validation/reward/easy_half")
    late = {
        name: [v for step, v in curve(records, f"train/episodes/{name}") if step > run["steps"] / 2]
        for name in ("tool_calls", "turns")
    }
    return run_figures(records, run) | {
        "hard_best": max(a for _, a in hard),
        "hard_start": hard[0][1],
        "hard_gain": max(a for _, a in hard) - hard[0][1],
        # turns, not tool calls, where observations are marked as actions: the call count reads the action mask
        "turns_last_half_mean": statistics.fmean(late["turns"]) if late["turns"] else 1.0,
        "hard_final": hard[-1][1],
        "easy_best": max(a for _, a in easy),
        "tool_calls_last_half_mean": statistics.fmean(late["tool_calls"]) if late["tool_calls"] else 0.0,
        "hard_curve": hard,
        "tool_calls_curve": curve(records, "train/episodes/tool_calls"),
    }


SPECS = {
    "episodes": Experiment(
        name="episodes_learning",
        question="tools with a critic: the calculator task with the tool, without, and the masking fault",
        recipe="examples/calculator-task.yaml",
        # without the tool a response gets the episodes' token budget
        arms={
            "tool": [],
            "no_tool": ["env.class=null", "policy.generation.max_new_tokens=96"],
            "observations_as_actions": [],
        },
        env={"observations_as_actions": {OBSERVATIONS_AS_ACTIONS_ENV: "1"}},
        metrics="""hard_best hard_start hard_gain hard_final easy_best accuracy_best tool_calls_last_half_mean
            turns_last_half_mean explained_var_last_half_mean""".split(),
        figures=figures,
        pairs={"paired": [("tool", "no_tool"), ("observations_as_actions", "tool")]},
        sft_seeds=(0, 1, 2),
        needs={"runs/calculator-task/train.jsonl": "python examples/make_calculator_task.py runs/calculator-task"},
    ),
}

if __name__ == "__main__":
    main(SPECS)
