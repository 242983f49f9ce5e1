"""A critic warmup that ends on the critic's explained variance against a fixed one
(docs/measurements/2026-12-03-critic-warmup-until-ev.md): on the demo's recipe and the mixed one, from several SFT
models each (the demo recipe's are bench.learning.lora's), the recipes' 10 critic-only steps against
``value.warmup.until_ev=0.3`` (window 3, at most 20 steps). Per run: critic-only steps, the critic's EV at the first
policy step, best and final validation accuracy, wall time (steps and validation); paired: ev − fixed."""

from __future__ import annotations

from bench.learning.driver import Experiment, Suite, main

ARMS = {
    "fixed": [],  # the recipes' value.warmup.steps: 10
    "ev": [
        "value.warmup.steps=0",
        "value.warmup.until_ev=0.3",
        "value.warmup.ev_window=3",
        "value.warmup.max_steps=20",
    ],
}


def figures(records: list[dict], run: dict) -> dict:
    steps = [r for r in records if r["step"] >= 1]
    accuracy = [(r["step"], r["validation/accuracy"]) for r in records if "validation/accuracy" in r]
    first_policy = next((r for r in steps if "train/loss" in r), {})  # none where the warmup outlasts the run
    return {
        "warmup_steps": steps[-1]["train/critic/warmup_steps"],
        "first_policy_step": first_policy.get("step"),
        "explained_var_first_policy_step": first_policy.get("train/critic/explained_var"),
        "accuracy_start": accuracy[0][1],
        "accuracy_best": max(a for _, a in accuracy),
        "accuracy_final": accuracy[-1][1],
        "wall_seconds": sum(r.get("timing/step", 0.0) + r.get("timing/validation", 0.0) for r in records),
        "explained_var_curve": [(r["step"], r["train/critic/explained_var"]) for r in steps],
        "accuracy_curve": accuracy,
    }


def part(task: str, recipe: str, sft_seeds: tuple[int, ...], sft_root: str = "") -> Experiment:
    return Experiment(
        name=f"warmup_{task}",
        question=f"the critic's warmup until its EV against a fixed one, on {recipe}",
        recipe=recipe,
        arms=ARMS,
        metrics=["warmup_steps", "explained_var_first_policy_step", "accuracy_best", "accuracy_final", "wall_seconds"],
        figures=figures,
        pairs={"ev - fixed": ("ev", "fixed")},
        sft_seeds=sft_seeds,
        runs=f"runs/warmup_learning/{task}",
        sft_root=sft_root,
    )


SPECS = {
    "warmup": Suite(
        name="warmup_learning",
        question="a critic warmup that ends on the critic's EV against a fixed one",
        parts={
            "critic": part("critic", "recipes/tiny-math-critic-cpu.yaml", (0, 2, 3), "runs/lora_learning/sft"),
            "mixed": part("mixed", "recipes/tiny-math-mixed-cpu.yaml", (0, 1, 2)),
        },
    ),
}

if __name__ == "__main__":
    main(SPECS)
