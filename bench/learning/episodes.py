"""Tools with a critic (docs/experiments/2026-12-02-tools-with-a-critic.md): PPO on the calculator task with the tool,
without it, and with the observation tokens wrongly trained on and valued as actions, from several SFT models.

    python examples/make_calculator_task.py runs/calculator-task
    python -m bench.learning.episodes [--sft-seeds 0 1 2] [--jobs 2] [--out FILE.json]

Each SFT model is trained once on the task's transcripts (to its plateau); every arm runs PPO seed 0 from each.
Per run: the hard half's validation accuracy (best, at step 0, final), the easy half's best, the tool calls per
episode over the last half of the steps, and the critic's explained variance over the last half. Per arm: mean and
95 % t-interval over SFT models; paired by SFT model: tool − no tool, and the ablation − tool.
"""

from __future__ import annotations

import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common.record import write_record
from bench.common.runs import COMMON, REPO, parser, print_summary, run_dtppo, usable_sft_models
from bench.common.stats import mean_ci95, paired_ci95, per_sft_model
from bench.learning.critic import sft_figures, summarise
from dtppo.faults import OBSERVATIONS_AS_ACTIONS_ENV
from dtppo.observability.logger import read_metrics

RECIPE = "examples/calculator-task.yaml"
# Each arm: its overrides and its environment variables. Without the tool a response gets the episodes' token budget.
ARMS = {
    "tool": ([], {}),
    "no_tool": (["env.class=null", "policy.generation.max_new_tokens=96"], {}),
    "observations_as_actions": ([], {OBSERVATIONS_AS_ACTIONS_ENV: "1"}),
}
METRICS = [
    "hard_best",
    "hard_start",
    "hard_gain",
    "hard_final",
    "easy_best",
    "accuracy_best",
    "tool_calls_last_half_mean",
    "turns_last_half_mean",
    "explained_var_last_half_mean",
]


def sft_args(root: Path, seed: int) -> list[str]:
    return [f"sft.seed={seed}", f"sft.output_dir={root / f'sft-seed{seed}'}"]


def curve(records: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in records if key in r]


def ppo_run(root: Path, sft_seed: int, arm: str) -> dict:
    overrides, env_extra = ARMS[arm]
    log_dir = root / "ppo" / f"{arm}_sft{sft_seed}"
    argv = ["ppo", RECIPE, *COMMON, *sft_args(root, sft_seed), *overrides, f"logger.log_dir={log_dir}"]
    records = read_metrics(REPO / log_dir, missing_ok=True)
    if not any(r["step"] == 40 for r in records):
        (REPO / log_dir).mkdir(parents=True, exist_ok=True)
        run_dtppo(argv, REPO / log_dir / "run.log", env_extra)
        records = read_metrics(REPO / log_dir)
    result = summarise(records, policy_start_step=10)
    hard, easy = curve(records, "validation/reward/hard_half"), curve(records, "validation/reward/easy_half")
    calls = [c for step, c in curve(records, "train/episodes/tool_calls") if step > 20]
    # Turns, not tool calls, where observations are marked as actions: the call count reads the action mask.
    turns = [t for step, t in curve(records, "train/episodes/turns") if step > 20]
    result |= {
        "hard_best": max(a for _, a in hard),
        "hard_start": hard[0][1],
        "hard_gain": max(a for _, a in hard) - hard[0][1],
        "turns_last_half_mean": statistics.fmean(turns) if turns else 1.0,
        "hard_final": hard[-1][1],
        "easy_best": max(a for _, a in easy),
        "tool_calls_last_half_mean": statistics.fmean(calls) if calls else 0.0,
        "hard_curve": hard,
        "tool_calls_curve": curve(records, "train/episodes/tool_calls"),
    }
    prefix = " ".join(f"{k}={v}" for k, v in env_extra.items())
    return {
        "arm": arm,
        "sft_seed": sft_seed,
        "command": f"{prefix + ' ' if prefix else ''}python -m dtppo " + " ".join(argv),
        "result": result,
    }


def report(runs: list[dict]) -> dict:
    per_arm = {arm: {m: mean_ci95(list(per_sft_model(runs, arm, m).values())) for m in METRICS} for arm in ARMS}
    differences = {
        f"{a} - {b}": {m: paired_ci95(runs, a, b, m) for m in METRICS}
        for a, b in [("tool", "no_tool"), ("observations_as_actions", "tool")]
    }
    return {"per_arm": per_arm, "paired": differences}


def main() -> None:
    jobs_help = "runs side by side (each: one process of 1 thread)"
    args = parser(__doc__.splitlines()[0], "calc-exp", "episodes_learning.json", jobs_help).parse_args()
    if not (REPO / "runs" / "calculator-task" / "train.jsonl").is_file():
        raise SystemExit("no data: run python examples/make_calculator_task.py runs/calculator-task first")

    with ThreadPoolExecutor(args.jobs) as pool:
        seeds = usable_sft_models(pool, RECIPE, args.root, args.sft_seeds, sft_args)
        jobs = [pool.submit(ppo_run, args.root, seed, arm) for seed in seeds for arm in ARMS]
        runs = []
        for job in jobs:
            runs.append(job.result())
            done = runs[-1]["result"]
            print(
                f"{runs[-1]['arm']:<24} sft {runs[-1]['sft_seed']}: hard {done['hard_start']:.3f} -> best "
                f"{done['hard_best']:.3f}, calls {done['tool_calls_last_half_mean']:.2f}, EV "
                f"{done['explained_var_last_half_mean']}",
                flush=True,
            )
    models = {seed: sft_figures(str(args.root / f"sft-seed{seed}")) for seed in args.sft_seeds}
    summary = report(runs)
    print_summary(summary["per_arm"], {"differences": summary["paired"]}, METRICS, 26)
    write_record(args.out, {"sft_models": models, "summary": summary, "runs": runs})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
