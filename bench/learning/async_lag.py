"""The critic under lag (docs/experiments/2026-12-02-critic-under-lag.md): ppo.max_lag k ∈ {0, 1, 2, 4} x
value.target_correction ∈ {none, vtrace} on the mixed recipe, from several SFT models, on one training rank and one
generation rank.

    python -m bench.learning.async_lag [--sft-seeds 0 1 2] [--lags 0 1 2 4] [--jobs 2] [--out FILE.json]

Each SFT model is trained once (to its plateau, then its careless stage); every arm runs PPO seed 0 from each.
Runs are deterministic whatever the timing (a batch's tokens depend on its prompts and its policy version only),
so ``--jobs`` runs go side by side without changing any number. Per run: best validation accuracy, the critic's
explained variance and loss, means of the last half of the steps, and its explained variance against the outcome
returns (the same yardstick whatever its targets: V-trace's bootstrap toward V raises the first, not this). Per
arm: mean and 95 % t-interval over SFT models; paired by SFT model: each lag against k = 0 without correction, and
V-trace against none at each lag.
"""

from __future__ import annotations

import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common.record import write_record
from bench.common.runs import COMMON, REPO, parser, print_summary, run_dtppo, usable_sft_models
from bench.common.stats import mean_ci95, paired_ci95, per_sft_model
from bench.learning.critic import sft_figures, summarise
from dtppo.observability.logger import read_metrics

RECIPE = "recipes/tiny-math-mixed-cpu.yaml"
LAYOUT = ["cluster.workers_per_node=2", "cluster.generation_ranks=1", "loss.rollout_is=token"]
METRICS = [
    "accuracy_best",
    "accuracy_final",
    "explained_var_last_half_mean",
    "critic_loss_last_half_mean",
    "outcome_explained_var_last_half_mean",
]


def sft_args(root: Path, seed: int) -> list[str]:
    return [f"sft.seed={seed}", f"sft.output_dir={root / 'sft' / f'seed{seed}'}"]


def arm_name(lag: int, correction: str) -> str:
    return f"k{lag}-{correction}"


def ppo_run(root: Path, sft_seed: int, lag: int, correction: str) -> dict:
    log_dir = root / "ppo" / f"{arm_name(lag, correction)}_sft{sft_seed}"
    argv = [
        "ppo",
        RECIPE,
        *COMMON,
        *LAYOUT,
        *sft_args(root, sft_seed),
        f"ppo.max_lag={lag}",
        f"value.target_correction={correction}",
        f"logger.log_dir={log_dir}",
    ]
    records = read_metrics(REPO / log_dir, missing_ok=True)
    if not any(r["step"] == 40 for r in records):
        (REPO / log_dir).mkdir(parents=True, exist_ok=True)
        run_dtppo(argv, REPO / log_dir / "run.log")
        records = read_metrics(REPO / log_dir)
    result = summarise(records, policy_start_step=10)
    for metric, name in [("loss", "critic_loss"), ("explained_var_outcome", "outcome_explained_var")]:
        late = [r[f"train/critic/{metric}"] for r in records if f"train/critic/{metric}" in r and r["step"] > 20]
        result[f"{name}_last_half_mean"] = statistics.fmean(late)
    return {
        "arm": arm_name(lag, correction),
        "lag": lag,
        "target_correction": correction,
        "sft_seed": sft_seed,
        "command": "python -m dtppo " + " ".join(argv),
        "result": result,
        "staleness_max": max(r.get("train/staleness/max", 0.0) for r in records),
    }


def report(runs: list[dict], lags: list[int]) -> dict:
    arms = [arm_name(k, c) for k in lags for c in ("none", "vtrace")]
    per_arm = {arm: {m: mean_ci95(list(per_sft_model(runs, arm, m).values())) for m in METRICS} for arm in arms}
    degradation = {
        f"{arm_name(k, 'none')} - {arm_name(0, 'none')}": {
            m: paired_ci95(runs, arm_name(k, "none"), arm_name(0, "none"), m) for m in METRICS
        }
        for k in lags
        if k
    }
    recovery = {
        f"{arm_name(k, 'vtrace')} - {arm_name(k, 'none')}": {
            m: paired_ci95(runs, arm_name(k, "vtrace"), arm_name(k, "none"), m) for m in METRICS
        }
        for k in lags
    }
    return {"per_arm": per_arm, "degradation": degradation, "recovery": recovery}


def main() -> None:
    jobs_help = "runs side by side (each: 2 processes of 1 thread)"
    options = parser(__doc__.splitlines()[0], "async_learning", "async_learning.json", jobs_help)
    options.add_argument("--lags", type=int, nargs="+", default=[0, 1, 2, 4])
    args = options.parse_args()
    if 0 not in args.lags:
        raise SystemExit("--lags must include 0 (the reference arm)")

    with ThreadPoolExecutor(args.jobs) as pool:
        seeds = usable_sft_models(pool, RECIPE, args.root, args.sft_seeds, sft_args)
        jobs = [
            pool.submit(ppo_run, args.root, seed, lag, correction)
            for seed in seeds
            for lag in args.lags
            for correction in ("none", "vtrace")
        ]
        runs = []
        for job in jobs:
            runs.append(job.result())
            done = runs[-1]
            print(
                f"{done['arm']:<10} sft {done['sft_seed']}: best {done['result']['accuracy_best']:.3f}, EV "
                f"{done['result']['explained_var_last_half_mean']:.3f}",
                flush=True,
            )
    models = {seed: sft_figures(str(args.root / "sft" / f"seed{seed}")) for seed in args.sft_seeds}
    summary = report(runs, args.lags)
    print_summary(summary["per_arm"], {t: summary[t] for t in ("degradation", "recovery")}, METRICS, 22)
    write_record(args.out, {"sft_models": models, "summary": summary, "runs": runs})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
