"""A long task that learns (docs/experiments/2026-12-05-long-task.md): running sums answered by every running total,
about 1,000 tokens per response (recipes/tiny-long-cpu.yaml), SFT and then PPO with a critic, policy and critic
context-parallel over 2 ranks (cp=2).

    python -m bench.learning.long_task [--sft-seeds 0 1 2] [--root runs/long_task] [--out FILE.json] [--keep FILE.json]

Each SFT model is trained once, then PPO seed 0 runs from it; both use the machine's 2 cores (the recipe's 2
ranks), so runs go one at a time. Per run: validation accuracy at the start (the SFT model's, greedy), best and
final; the critic's explained variance, mean over the last half of its steps; the mean response length and the
truncation rate at the start and at the end; seconds per step. Over SFT models: mean and 95 % t-interval, and the
gain final − start with its interval. ``--keep`` takes the runs of an earlier record for the SFT seeds not run now
(their run folders may be gone: a run of ~35 minutes per model is not repeated to write a combined record).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from bench.common.record import write_record
from bench.common.runs import COMMON, REPO, parser, run_dtppo, train_sft
from bench.common.stats import ci_cell, mean_ci95
from bench.learning.critic import sft_figures
from dtppo.observability.logger import explained_var_mean, read_metrics

RECIPE = "recipes/tiny-long-cpu.yaml"
STEPS = 20
METRICS = [
    "accuracy_start",
    "accuracy_best",
    "accuracy_final",
    "gain_final",
    "explained_var_last_half",
    "response_length_first",
    "response_length_last",
]


def sft_dir(root: Path, seed: int) -> Path:
    return root / "sft" / f"seed{seed}"


def sft_args(root: Path, seed: int) -> list[str]:
    return [f"sft.seed={seed}", f"sft.output_dir={sft_dir(root, seed)}"]


def figures(records: list[dict]) -> dict:
    """One run's figures from its metrics.jsonl records."""
    steps = [r for r in records if r["step"] >= 1]
    accuracy = [(r["step"], r["validation/accuracy"]) for r in records if "validation/accuracy" in r]
    return {
        "accuracy_start": accuracy[0][1],
        "accuracy_best": max(a for _, a in accuracy),
        "accuracy_final": accuracy[-1][1],
        "gain_final": accuracy[-1][1] - accuracy[0][1],
        "explained_var_last_half": explained_var_mean(steps, STEPS / 2)[0],
        "response_length_first": steps[0]["train/mean_gen_tokens_per_sample"],
        "response_length_last": steps[-1]["train/mean_gen_tokens_per_sample"],
        "truncation_rate_first": steps[0]["train/truncation_rate"],
        "truncation_rate_last": steps[-1]["train/truncation_rate"],
        "seconds_per_step": statistics.median(r["timing/step"] for r in steps),
        "accuracy_curve": accuracy,
        "reward_curve": [(r["step"], r["train/reward"]) for r in steps],
        "explained_var_curve": [(r["step"], r["train/critic/explained_var"]) for r in steps],
    }


def kept_runs(path: Path, seeds: list[int]) -> tuple[list[dict], dict[int, dict], dict[int, dict]]:
    """The runs, SFT-model figures and below-floor SFT models of the record at ``path`` for SFT seeds other than
    ``seeds``."""
    record = json.loads(path.read_text())
    runs = [r for r in record["runs"] if r["sft_seed"] not in seeds]

    def others(models: dict) -> dict[int, dict]:
        return {int(seed): figures for seed, figures in models.items() if int(seed) not in seeds}

    models, below = others(record["sft_models"]), others(record.get("sft_models_below_floor", {}))
    print(f"kept from {path}: SFT models {sorted(models)}, below the floor {sorted(below)}", flush=True)
    return runs, models, below


def ppo_run(root: Path, sft_seed: int) -> dict:
    log_dir = root / "ppo" / f"sft{sft_seed}"
    argv = ["ppo", RECIPE, *COMMON, *sft_args(root, sft_seed), f"logger.log_dir={log_dir}"]
    records = read_metrics(REPO / log_dir, missing_ok=True)
    if not any(r["step"] == STEPS for r in records):
        (REPO / log_dir).mkdir(parents=True, exist_ok=True)
        run_dtppo(argv, REPO / log_dir / "run.log")
        records = read_metrics(REPO / log_dir)
    return {"sft_seed": sft_seed, "command": "python -m dtppo " + " ".join(argv), "result": figures(records)}


def main() -> None:
    cli = parser(__doc__.splitlines()[0], "long_task", "long_task.json", "unused: runs go one at a time")
    cli.add_argument("--keep", type=Path, help="an earlier record whose runs of other SFT seeds are kept")
    args = cli.parse_args()
    kept_runs_, kept_models, kept_below = kept_runs(args.keep, args.sft_seeds) if args.keep else ([], {}, {})
    runs, below_floor = [], {}
    for seed in args.sft_seeds:
        if train_sft(RECIPE, args.root, seed, sft_args(args.root, seed)) != 0:
            print(f"SFT model {seed} ended below its floor (sft.min_accuracy): left out, as the protocol says")
            below_floor[seed] = sft_figures(str(sft_dir(args.root, seed)))
            continue
        runs.append(ppo_run(args.root, seed))
        done = runs[-1]["result"]
        print(
            f"sft {seed}: accuracy {done['accuracy_start']:.3f} -> {done['accuracy_final']:.3f} "
            f"(best {done['accuracy_best']:.3f}), critic EV {done['explained_var_last_half']:.3f}, "
            f"{done['seconds_per_step']:.1f} s/step",
            flush=True,
        )
    models = {r["sft_seed"]: sft_figures(str(sft_dir(args.root, r["sft_seed"]))) for r in runs}
    runs = sorted(kept_runs_ + runs, key=lambda r: r["sft_seed"])
    models = dict(sorted({**kept_models, **models}.items()))
    below_floor = dict(sorted({**kept_below, **below_floor}.items()))
    if not runs:
        print("no SFT model reached the floor: nothing to compare (the protocol's outcome; see the record)")
        return
    summary = {m: mean_ci95([r["result"][m] for r in runs]) for m in METRICS}
    print(f"\n{RECIPE}, PPO {STEPS} steps at cp=2, over {len(runs)} SFT models (mean [95 % interval])")
    for metric in METRICS:
        print(f"{metric:<26}{ci_cell(summary[metric], metric == 'gain_final'):>34}")
    record = {
        "recipe": RECIPE,
        "sft_models": models,
        "sft_models_below_floor": below_floor,
        "summary": summary,
        "runs": runs,
    }
    write_record(args.out, record)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
