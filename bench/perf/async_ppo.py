"""Asynchronous PPO on 2 CPU cores: steps per second of the same PPO work in four layouts, side by side in one run.

    python -m bench.perf.async_ppo [--steps 14] [--warmup 4] [--repeats 2] [--out bench/results/perf/async.json]

Arms, each a `dtppo ppo` run of the tiny recipe from a random-init model (no SFT, no validation but the last step's,
the same seed and batch): (a) colocated, 2 ranks each generating and training half of every batch; (b) split-sync,
1 training rank + 1 generation rank, ppo.max_lag=0; (c) async-k1, the same split with ppo.max_lag=1 (generating step
i+1 while training on step i); (d) async-k2, ppo.max_lag=2. Arms run in a rotated order per repeat. Speed: steps per
second after the warm-up steps, from the step times each run logs; per arm also each phase's median, the generation
ranks' busy share and the trainer's wait for batches. Workloads: ``balanced``, 8 prompts x up to 256 new tokens, where
one generation rank and one training rank take about the same time per step on a 2-core EPYC; ``demo``, the demo
recipe's 64 x 48, where training takes about 5x as long as sampling.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common.paths import PERF, REPO
from bench.common.record import write_record

RECIPE = REPO / "recipes" / "tiny-math-cpu.yaml"

BATCH_8 = [
    f"{role}.{key}=8" for role in ("policy", "value") for key in ("train_global_batch_size", "train_micro_batch_size")
]
WORKLOADS = {
    "balanced": ["ppo.num_prompts_per_step=8", "policy.generation.max_new_tokens=256", *BATCH_8],
    "demo": ["ppo.num_prompts_per_step=64", "policy.generation.max_new_tokens=48"],
}
SPLIT = ["cluster.workers_per_node=2", "cluster.generation_ranks=1"]
ARMS = {
    "colocated": ["cluster.workers_per_node=2"],
    "split-sync": SPLIT,
    "async-k1": [*SPLIT, "ppo.max_lag=1", "loss.rollout_correction.importance_sampling=token"],
    "async-k2": [*SPLIT, "ppo.max_lag=2", "loss.rollout_correction.importance_sampling=token"],
}
PHASES = ["perf/generation_busy_fraction"] + [
    f"timing/{phase}"
    for phase in """step generation generation_wait generation_busy train_wait reward value_inference policy_logprobs
    critic_update policy_update weight_refit""".split()
]


def command(workload: str, arm: str, steps: int, log_dir: Path) -> list[str]:
    fixed = """ppo.init_from_sft=false ppo.validation.at_start=false ppo.validation.max_samples=16
        checkpointing.enabled=false logger.tensorboard=false logger.progress=false""".split()
    run = [f"ppo.max_num_steps={steps}", f"ppo.validation.period={steps}", f"logger.log_dir={log_dir}"]
    return [sys.executable, "-m", "dtppo", "ppo", str(RECIPE), *fixed, *run, *WORKLOADS[workload], *ARMS[arm]]


def run_arm(workload: str, arm: str, steps: int, warmup: int, workdir: Path, repeat: int) -> dict:
    log_dir = workdir / f"{workload}-{arm}-{repeat}"
    cmd = command(workload, arm, steps, log_dir)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=dict(os.environ))
    if proc.returncode != 0:
        raise RuntimeError(f"{workload}/{arm} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steady = [r for r in records if "timing/step" in r and r["step"] > warmup]
    seconds = sum(r["timing/step"] for r in steady)
    phases = {k: statistics.median(r[k] for r in steady) for k in PHASES if all(k in r for r in steady)}
    tokens = statistics.mean(r["train/mean_gen_tokens_per_sample"] for r in steady)
    shown = " ".join(c for c in cmd[2:] if not c.startswith("logger.log_dir"))
    return {
        "workload": workload,
        "arm": arm,
        "repeat": repeat,
        "steps_per_s": len(steady) / seconds,
        "mean_step_s": seconds / len(steady),
        "steps_measured": len(steady),
        "mean_gen_tokens_per_sample": tokens,
        "median_phase_s": phases,
        "wall_s": time.perf_counter() - start,
        "command": f"python -m {shown}",
    }


def summarise(rows: list[dict]) -> list[dict]:
    """Per workload and arm: mean steps/s over repeats, and the ratios to split-sync and colocated."""
    out = []
    for workload in WORKLOADS:
        by_arm = {arm: [r for r in rows if (r["workload"], r["arm"]) == (workload, arm)] for arm in ARMS}
        by_arm = {arm: runs for arm, runs in by_arm.items() if runs}
        mean = {arm: statistics.mean(r["steps_per_s"] for r in rs) for arm, rs in by_arm.items()}
        for arm, rs in by_arm.items():
            out.append(
                {
                    "workload": workload,
                    "arm": arm,
                    "steps_per_s": mean[arm],
                    "runs": [round(r["steps_per_s"], 4) for r in rs],
                    "vs_split_sync": mean[arm] / mean["split-sync"] if "split-sync" in mean else None,
                    "vs_colocated": mean[arm] / mean["colocated"] if "colocated" in mean else None,
                    "mean_gen_tokens_per_sample": statistics.mean(r["mean_gen_tokens_per_sample"] for r in rs),
                    "median_phase_s": {
                        k: statistics.mean(r["median_phase_s"][k] for r in rs) for k in rs[0]["median_phase_s"]
                    },
                    "command": rs[0]["command"],
                }
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--warmup", type=int, default=4, help="first steps left out (start-up, first batches)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--out", type=Path, default=PERF / "async.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="dtppo-async-") as tmp:
        arms = list(ARMS)
        for repeat in range(args.repeats):
            order = arms[repeat % len(arms) :] + arms[: repeat % len(arms)]
            for workload in args.workloads:
                for arm in order:
                    row = run_arm(workload, arm, args.steps, args.warmup, Path(tmp), repeat)
                    rows.append(row)
                    print(f"{workload:9s} {arm:11s} repeat {repeat}: {row['steps_per_s']:.3f} steps/s", flush=True)
    summary = summarise(rows)
    print(f"\n{'workload':9s} {'arm':11s} {'steps/s':>8s} {'vs (b)':>7s} {'vs (a)':>7s} {'gen busy':>9s}  command")
    for s in summary:
        busy = s["median_phase_s"].get("perf/generation_busy_fraction")
        print(
            f"{s['workload']:9s} {s['arm']:11s} {s['steps_per_s']:8.3f} {s['vs_split_sync']:7.2f} "
            f"{s['vs_colocated']:7.2f} {'' if busy is None else f'{busy:9.2f}':>9s}  {s['command']}"
        )
    machine = {"cpus": os.cpu_count(), "kernels": os.environ.get("ATEN_CPU_CAPABILITY", "default")}
    write_record(
        args.out, {"machine": machine, "steps": args.steps, "warmup": args.warmup, "summary": summary, "runs": rows}
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
