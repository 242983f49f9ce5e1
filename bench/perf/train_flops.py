"""Training throughput of the ~20M-parameter Qwen2 policy + critic (forward, backward, AdamW) through dtppo's
workers, padded against sequence-packed, as useful GFLOP/s and % of this machine's fp32 matmul peak (FLOPs:
bench/common/workload.py). One process builds both variants and alternates their steps, so that load from other
processes hits both alike, the peak measured in it before, between and after the steps; each variant's peak RSS
comes from a fresh process of its own. Writes bench/results/perf/train_flops_<threads>t.json.

    python -m bench.perf.train_flops [--model 20m|tiny] [--steps 3] [--batch 32] [--micro 8] [--seq 256] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from bench.common.paths import PERF, REPO
from bench.common.record import kernels_prefix, write_record
from bench.common.workload import (
    MODELS,
    Clock,
    executed_tokens,
    make_config,
    matmul_peak_gflops,
    rollout_batch,
    train_flops,
)
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.workers.policy import PolicyWorker
from dtppo.workers.value import ValueWorker

VARIANTS = {"padded": False, "packed": True}


def build(args: argparse.Namespace, packing: bool):
    """Policy and critic workers and a rollout batch with old values / log-probs filled in."""
    cfg = make_config(MODELS[args.model], args.batch, args.micro, packing)
    tok = build_char_tokenizer()
    policy, value = PolicyWorker(cfg, tok), ValueWorker(cfg, tok)
    exp = rollout_batch(len(tok), args.batch, args.seq)
    exp = exp.replace(old_values=value.get_values(exp), old_logprobs=policy.get_logprobs(exp))
    return {"critic": value, "policy": policy}, exp


def timed_train(worker, exp) -> tuple[float, float]:
    """(wall s, CPU s) of one update."""
    with Clock() as clock:
        worker.train(exp)
    return clock.wall, clock.cpu


def measure_times(args: argparse.Namespace) -> dict:
    """Both variants in this process, steps alternating; the first step of each warms up."""
    torch.set_num_threads(args.threads)
    peaks = [matmul_peak_gflops()]
    built = {variant: build(args, packing) for variant, packing in VARIANTS.items()}
    times = {v: {"critic": [], "policy": []} for v in VARIANTS}
    cpu_times = {v: {"critic": [], "policy": []} for v in VARIANTS}
    for step in range(args.steps + 1):
        for variant, (workers, exp) in built.items():
            for name, worker in workers.items():
                wall, cpu = timed_train(worker, exp)
                if step > 0:
                    times[variant][name].append(wall)
                    cpu_times[variant][name].append(cpu)
        if step == args.steps // 2:
            peaks.append(matmul_peak_gflops())
    peaks.append(matmul_peak_gflops())
    workers, exp = built["padded"]
    vocab = workers["policy"].model.config.vocab_size
    lengths, model = exp.attention_mask.sum(-1), MODELS[args.model]
    return {
        "times": times,
        "cpu_times": cpu_times,
        "flops": {"critic": train_flops(model, 1, lengths), "policy": train_flops(model, vocab, lengths)},
        "params": {name: sum(p.numel() for p in w.model.parameters()) for name, w in workers.items()},
        "real_tokens": int(lengths.sum()),
        "executed_tokens": {v: executed_tokens(exp, args.micro, packing) for v, packing in VARIANTS.items()},
        "padded_width": exp.input_ids.shape[1],
        "peak_gflops": peaks,
    }


def measure_memory(args: argparse.Namespace, variant: str) -> dict:
    """Peak RSS of a fresh process that builds one variant and runs a warm-up step and one step."""
    torch.set_num_threads(args.threads)
    workers, exp = build(args, VARIANTS[variant])
    for _ in range(2):
        for worker in workers.values():
            worker.train(exp)
    return {"peak_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # Linux: KiB


def rows_from(result: dict, memory: dict, command: str) -> list[dict]:
    flops = sum(result["flops"].values())
    # The largest readings: % of peak is then a lower bound.
    peak = max(p["wall"] for p in result["peak_gflops"])
    peak_cpu = max(p["cpu"] for p in result["peak_gflops"])
    rows = []
    for variant, times in result["times"].items():
        mean = {name: sum(t) / len(t) for name, t in times.items()}
        step_s = sum(mean.values())
        cpu_s = sum(sum(t) / len(t) for t in result["cpu_times"][variant].values())
        rows.append(
            {
                "variant": variant,
                "step_s": step_s,
                "critic_s": mean["critic"],
                "policy_s": mean["policy"],
                "tokens_per_s": 2 * result["real_tokens"] / step_s,  # each real token trains two models
                "gflops": flops / step_s / 1e9,
                "critic_gflops": result["flops"]["critic"] / mean["critic"] / 1e9,
                "policy_gflops": result["flops"]["policy"] / mean["policy"] / 1e9,
                "peak_gflops": peak,
                "pct_of_peak": 100.0 * flops / step_s / 1e9 / peak,
                "step_cpu_s": cpu_s,
                "gflop_per_cpu_s": flops / cpu_s / 1e9,
                "peak_gflop_per_cpu_s": peak_cpu,
                "pct_of_peak_cpu_time": 100.0 * flops / cpu_s / 1e9 / peak_cpu,
                "real_tokens": result["real_tokens"],
                "executed_tokens": result["executed_tokens"][variant],
                "padded_width": result["padded_width"],
                "params": result["params"],
                "train_flops_per_step": flops,
                "step_times_s": times,
                "step_cpu_times_s": result["cpu_times"][variant],
                "peak_gflops_readings": result["peak_gflops"],
                "peak_rss_MiB": memory[variant]["peak_rss_MiB"],
                "command": command,
            }
        )
    return rows


def run_child(mode: str, out: str) -> dict:
    argv = [sys.executable, "-m", "bench.perf.train_flops", *sys.argv[1:], "--child", mode, "--result", out]
    subprocess.run(argv, cwd=REPO, check=True)
    return json.loads(Path(out).read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--model", choices=list(MODELS), default="20m", help="20m, or the demo's tiny model")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--child", help="internal: 'times' or a variant name (memory), run in this process")
    parser.add_argument("--result", help="internal: where a child writes its raw result")
    args = parser.parse_args()
    if args.child:
        result = measure_times(args) if args.child == "times" else measure_memory(args, args.child)
        Path(args.result).write_text(json.dumps(result))
        return
    command = kernels_prefix() + (
        f"python -m bench.perf.train_flops --model {args.model} --steps {args.steps} --batch {args.batch} "
        f"--micro {args.micro} --seq {args.seq} --threads {args.threads}"
    )
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        result = run_child("times", os.path.join(tmp, "times.json"))
        memory = {v: run_child(v, os.path.join(tmp, f"{v}.json")) for v in VARIANTS}
    rows = rows_from(result, memory, command)
    print_table(rows)
    meta = {
        "args": {k: v for k, v in vars(args).items() if k not in ("child", "result")},
        "model": MODELS[args.model],
        "load_average_before_after": [load_before, os.getloadavg()],
        "cpu_count": os.cpu_count(),
    }
    # One file per thread count: a 1-thread run (steadier on a shared machine) does not replace the full one.
    name = "train_flops" if args.model == "20m" else f"train_flops_{args.model}"
    write_record(PERF / f"{name}_{args.threads}t.json", {**meta, "rows": rows}, command, indent=2)


def print_table(rows: list[dict]) -> None:
    cols = {"variant": "{:<8}", "step_s": "{:>8.2f}", "tokens_per_s": "{:>7.0f}", "gflops": "{:>8.1f}"}
    cols |= {"critic_gflops": "{:>7.1f}", "policy_gflops": "{:>7.1f}", "peak_gflops": "{:>7.1f}"}
    cols |= {"pct_of_peak": "{:>7.1f}", "pct_of_peak_cpu_time": "{:>13.1f}", "executed_tokens": "{:>13d}"}
    cols |= {"peak_rss_MiB": "{:>8.0f}"}
    heads = "variant,step s,tok/s,GFLOP/s,critic,policy,peak,% peak,% peak/CPU-s,computed tok,RSS MiB".split(",")
    widths = [len(fmt.format(rows[0][key])) for key, fmt in cols.items()]
    print(heads[0].ljust(widths[0]) + "".join(h.rjust(w) for h, w in zip(heads[1:], widths[1:])))
    for r in rows:
        print("".join(fmt.format(r[key]) for key, fmt in cols.items()))
    first = rows[0]
    print(
        f"real tokens per step: {first['real_tokens']} (longest row {first['padded_width']}); params: {first['params']}"
    )


if __name__ == "__main__":
    main()
