"""LoRA against full fine-tuning on the tiny task (docs/experiments/2026-12-03-lora-vs-full-fine-tuning.md): the
critic's recipe from several SFT models, policy and critic both with adapters (rank 16, alpha 32, all-linear) at the
full run's learning rates and at 10 times them, against full fine-tuning.

    python -m bench.learning.lora [--sft-seeds 0 1 2] [--jobs 2] [--out FILE.json]

Each SFT model is trained once; every arm runs PPO seed 0 from each. Per run: start, best and final validation
accuracy, the critic's explained variance (last half of the steps). Per arm: mean and 95 % t-interval over SFT
models; paired by SFT model: each LoRA arm minus full fine-tuning.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common.record import write_record
from bench.common.runs import COMMON, REPO, parser, print_summary, run_dtppo, usable_sft_models
from bench.common.stats import mean_ci95, paired_ci95, per_sft_model
from bench.learning.critic import sft_figures, summarise
from dtppo.observability.logger import read_metrics

RECIPE = "recipes/tiny-math-critic-cpu.yaml"
STEPS = 40
LORA = [f"{role}.lora.{key}" for role in ("policy", "value") for key in ("rank=16", "alpha=32")]
POLICY_LR, CRITIC_LR = 1e-4, 1e-3  # the recipe's
ARMS = {
    "full": [],
    "lora-lr1x": [*LORA, f"policy.optimizer.lr={POLICY_LR}", f"value.optimizer.lr={CRITIC_LR}"],
    "lora-lr10x": [*LORA, f"policy.optimizer.lr={10 * POLICY_LR}", f"value.optimizer.lr={10 * CRITIC_LR}"],
}
METRICS = ["accuracy_start", "accuracy_best", "accuracy_final", "explained_var_last_half_mean"]


def sft_args(root: Path, seed: int) -> list[str]:
    return [f"sft.seed={seed}", f"sft.output_dir={root / 'sft' / f'seed{seed}'}"]


def ppo_run(root: Path, sft_seed: int, arm: str) -> dict:
    log_dir = root / "ppo" / f"{arm}_sft{sft_seed}"
    argv = ["ppo", RECIPE, *COMMON, *sft_args(root, sft_seed), *ARMS[arm], f"logger.log_dir={log_dir}"]
    records = read_metrics(REPO / log_dir, missing_ok=True)
    if not any(r["step"] == STEPS for r in records):
        (REPO / log_dir).mkdir(parents=True, exist_ok=True)
        run_dtppo(argv, REPO / log_dir / "run.log")
        records = read_metrics(REPO / log_dir)
    seconds = sum(r.get("timing/step_s", 0.0) for r in records)
    return {
        "arm": arm,
        "sft_seed": sft_seed,
        "command": "python -m dtppo " + " ".join(argv),
        "result": summarise(records, policy_start_step=10),
        "train_seconds": seconds,
    }


def report(runs: list[dict]) -> dict:
    per_arm = {arm: {m: mean_ci95(list(per_sft_model(runs, arm, m).values())) for m in METRICS} for arm in ARMS}
    versus_full = {
        f"{arm} - full": {m: paired_ci95(runs, arm, "full", m) for m in METRICS} for arm in ARMS if arm != "full"
    }
    return {"per_arm": per_arm, "versus_full": versus_full}


def main() -> None:
    jobs_help = "runs side by side (each one process of 1 thread)"
    args = parser(__doc__.splitlines()[0], "lora_learning", "lora_learning.json", jobs_help).parse_args()

    with ThreadPoolExecutor(args.jobs) as pool:
        seeds = usable_sft_models(pool, RECIPE, args.root, args.sft_seeds, sft_args)
        jobs = [pool.submit(ppo_run, args.root, seed, arm) for seed in seeds for arm in ARMS]
        runs = []
        for job in jobs:
            runs.append(job.result())
            done = runs[-1]
            print(f"{done['arm']:<11} sft {done['sft_seed']}: best {done['result']['accuracy_best']:.3f}", flush=True)
    models = {seed: sft_figures(str(args.root / "sft" / f"seed{seed}")) for seed in args.sft_seeds}
    summary = report(runs)
    print_summary(summary["per_arm"], {"against full fine-tuning": summary["versus_full"]}, METRICS, 18)
    write_record(args.out, {"sft_models": models, "arms": ARMS, "summary": summary, "runs": runs})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
