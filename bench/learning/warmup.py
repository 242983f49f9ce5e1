"""A critic warmup that ends on the critic's explained variance against today's fixed one
(docs/experiments/2026-12-03-critic-warmup-until-ev.md): on the demo's recipe (tiny-math-critic-cpu) and the mixed one,
from several SFT models each, the recipe's 10 critic-only steps against ``value.warmup_until_ev=0.3`` (window 3, at most
20 steps).

    python -m bench.learning.warmup [--critic-root runs/lora_learning] [--critic-seeds 0 2 3]
                                    [--mixed-seeds 0 1 2] [--jobs 2] [--out FILE.json]

Each SFT model is trained once (the critic recipe's may be issue 33's, under --critic-root); every arm runs PPO seed
0 from each. Per run: critic-only steps, the critic's EV at the first policy step, best and final validation accuracy,
wall time (steps and validation). Per arm: mean and 95 % t-interval over SFT models; paired by SFT model: ev − fixed.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common.paths import LEARNING
from bench.common.record import write_record
from bench.common.runs import COMMON, REPO, print_summary, run_dtppo, usable_sft_models
from bench.common.stats import mean_ci95, paired_ci95, per_sft_model
from bench.learning.critic import sft_figures
from dtppo.observability.logger import read_metrics

STEPS = 40
RECIPES = {"critic": "recipes/tiny-math-critic-cpu.yaml", "mixed": "recipes/tiny-math-mixed-cpu.yaml"}
ARMS = {
    "fixed": [],  # the recipes' ppo.policy_training_start_step: 10
    "ev": [
        "ppo.policy_training_start_step=0",
        "value.warmup_until_ev=0.3",
        "value.warmup_ev_window=3",
        "value.warmup_max_steps=20",
    ],
}
METRICS = ["warmup_steps", "explained_var_first_policy_step", "accuracy_best", "accuracy_final", "wall_seconds"]


def sft_args(root: Path, seed: int) -> list[str]:
    return [f"sft.seed={seed}", f"sft.output_dir={root / 'sft' / f'seed{seed}'}"]


def figures(records: list[dict]) -> dict:
    """One run's figures from its metrics.jsonl records."""
    steps = [r for r in records if r["step"] >= 1]
    accuracy = [(r["step"], r["validation/accuracy"]) for r in records if "validation/accuracy" in r]
    first_policy = next(r for r in steps if "train/loss" in r)
    return {
        "warmup_steps": steps[-1]["train/critic/warmup_steps"],
        "first_policy_step": first_policy["step"],
        "explained_var_first_policy_step": first_policy["train/critic/explained_var"],
        "accuracy_start": accuracy[0][1],
        "accuracy_best": max(a for _, a in accuracy),
        "accuracy_final": accuracy[-1][1],
        "wall_seconds": sum(r.get("timing/step", 0.0) + r.get("timing/validation", 0.0) for r in records),
        "explained_var_curve": [(r["step"], r["train/critic/explained_var"]) for r in steps],
        "accuracy_curve": accuracy,
    }


def ppo_run(task: str, root: Path, sft_root: Path, sft_seed: int, arm: str) -> dict:
    log_dir = root / task / "ppo" / f"{arm}_sft{sft_seed}"
    argv = ["ppo", RECIPES[task], *COMMON, *sft_args(sft_root, sft_seed), *ARMS[arm], f"logger.log_dir={log_dir}"]
    records = read_metrics(REPO / log_dir, missing_ok=True)
    if not any(r["step"] == STEPS for r in records):
        (REPO / log_dir).mkdir(parents=True, exist_ok=True)
        run_dtppo(argv, REPO / log_dir / "run.log")
        records = read_metrics(REPO / log_dir)
    return {
        "task": task,
        "arm": arm,
        "sft_seed": sft_seed,
        "command": "python -m dtppo " + " ".join(argv),
        "result": figures(records),
    }


def report(runs: list[dict]) -> dict:
    summary = {}
    for task in RECIPES:
        mine = [r for r in runs if r["task"] == task]
        per_arm = {arm: {m: mean_ci95(list(per_sft_model(mine, arm, m).values())) for m in METRICS} for arm in ARMS}
        summary[task] = {"per_arm": per_arm, "ev - fixed": {m: paired_ci95(mine, "ev", "fixed", m) for m in METRICS}}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--critic-root", type=Path, default=Path("runs") / "lora_learning")
    parser.add_argument("--critic-seeds", type=int, nargs="+", default=[0, 2, 3])
    parser.add_argument("--mixed-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side (each one process of 1 thread)")
    parser.add_argument("--root", type=Path, default=Path("runs") / "warmup_learning")
    parser.add_argument("--out", type=Path, default=LEARNING / "warmup_learning.json")
    args = parser.parse_args()
    sft_roots = {"critic": args.critic_root, "mixed": args.root / "mixed"}
    wanted = {"critic": args.critic_seeds, "mixed": args.mixed_seeds}
    with ThreadPoolExecutor(args.jobs) as pool:
        seeds = {
            task: usable_sft_models(pool, RECIPES[task], sft_roots[task], wanted[task], sft_args) for task in RECIPES
        }
        jobs = [
            pool.submit(ppo_run, task, args.root, sft_roots[task], seed, arm)
            for task in RECIPES
            for seed in seeds[task]
            for arm in ARMS
        ]
        runs = []
        for job in jobs:
            runs.append(job.result())
            run, done = runs[-1], runs[-1]["result"]
            print(
                f"{run['task']:<7}{run['arm']:<6} sft {run['sft_seed']}: warmup {done['warmup_steps']:.0f} steps, "
                f"EV then {done['explained_var_first_policy_step']:.3f}, best {done['accuracy_best']:.3f}",
                flush=True,
            )
    models = {
        task: {s: sft_figures(str(sft_roots[task] / "sft" / f"seed{s}")) for s in seeds[task]} for task in RECIPES
    }
    summary = report(runs)
    for task in RECIPES:
        print(f"\n== {RECIPES[task]}")
        paired = {"against the fixed warmup": {"ev - fixed": summary[task]["ev - fixed"]}}
        print_summary(summary[task]["per_arm"], paired, METRICS, 12)
    write_record(args.out, {"sft_models": models, "arms": ARMS, "summary": summary, "runs": runs})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
