"""Data-parallel scaling of the ~20M-parameter policy + critic updates at one global batch: dp=1 (one process, one
thread) against dp=2 (two gloo ranks of one thread, FSDP2) with unsharded gradient accumulation (one all-gather and
one reduce-scatter per optimizer step), with FSDP's per-microbatch resharding, and replicated (HSDP, one gradient
all-reduce per step). Also where dp=2 spends its time: FSDP's all-gather and reduce-scatter, from the profiler's
FSDP::* regions of one more step (synchronous on CPU: waiting for the other rank included), and each rank's tokens.
Layouts run interleaved, round by round, a layout's step time the median of all its steps (single steps vary by
±10 % even on an idle machine). Writes bench/results/perf/scaling.json.

    python -m bench.perf.scaling [--rounds 2] [--steps 3] [--batch 32] [--micro 8] [--seq 256]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from bench.common.paths import PERF
from bench.common.record import kernels_prefix, write_record
from bench.common.workload import MODEL_20M, make_config, matmul_peak_gflops, rollout_batch, train_flops
from dtppo.distributed.comm import all_gather_rows, all_reduce, barrier, rank, world_size
from dtppo.distributed.ranks import run_ranks
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.types import balanced_rows, block_rows
from dtppo.workers.policy import PolicyWorker
from dtppo.workers.value import ValueWorker

LAYOUTS = [  # (name, ranks, extra overrides)
    ("dp=1", 1, []),
    ("dp=2", 2, []),
    (
        "dp=2 per-microbatch reshard",
        2,
        [f"{w}.parallel.unsharded_grad_accumulation=false" for w in ("policy", "value")],
    ),
    ("dp=2 replicated (HSDP 2x1)", 2, [f"{w}.parallel.dp_replicate=2" for w in ("policy", "value")]),
]

# Profiler regions of FSDP2 whose time is communication (or waiting for the peer inside it).
COMM_REGIONS = ("FSDP::all_gather", "FSDP::post_backward_reduce", "FSDP::post_backward_rs_wait")


def timed(worker, exp) -> float:
    """Seconds of one update, the slowest rank's (a step ends when every rank is done)."""
    barrier()
    start = time.perf_counter()
    worker.train(exp)
    return float(all_reduce(torch.tensor(time.perf_counter() - start), "max"))


def profiled(worker, exp) -> dict[str, float]:
    """This rank's seconds in each FSDP communication region and in the whole update, one profiled step."""
    barrier()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        worker.train(exp)
        total = time.perf_counter() - start
    regions: dict[str, float] = defaultdict(float)
    for event in prof.events():
        name = event.name.split(" (")[0]
        if name in COMM_REGIONS:
            regions[name] += event.cpu_time_total / 1e6
    return {"update_s": total, **regions}


def collective_seconds(numel: int, reps: int = 3) -> dict[str, float]:
    """Best-of-``reps`` seconds of the gloo collectives FSDP (all-gather, reduce-scatter) and DDP (all-reduce)
    would use for ``numel`` fp32 values: one model's parameters or gradients."""
    world = world_size()
    full, shard = torch.ones(numel // world * world), torch.ones(numel // world)
    ops = {
        "all_gather": lambda: dist.all_gather_single(full, shard),
        "reduce_scatter": lambda: dist.reduce_scatter_single(shard, full),
        "all_reduce": lambda: dist.all_reduce(full),
    }
    best = {}
    for name, op in ops.items():
        op()
        for _ in range(reps):
            barrier()
            start = time.perf_counter()
            op()
            elapsed = float(all_reduce(torch.tensor(time.perf_counter() - start), "max"))
            best[name] = min(best.get(name, elapsed), elapsed)
    return best


def measure(args: argparse.Namespace, extra: list[str], out_path: str) -> None:
    """Runs on every rank: build, warm up, ``args.steps`` timed updates of each model, one profiled."""
    torch.set_num_threads(1)
    peak = matmul_peak_gflops()["wall"]
    cfg = make_config(
        MODEL_20M, args.batch, args.micro, args.packing, [f"cluster.workers_per_node={world_size()}", *extra]
    )
    tok = build_char_tokenizer()
    workers = {"critic": ValueWorker(cfg, tok), "policy": PolicyWorker(cfg, tok)}
    exp = rollout_batch(len(tok), args.batch, args.seq)
    exp = exp.replace(old_values=workers["critic"].get_values(exp), old_logprobs=workers["policy"].get_logprobs(exp))
    times = {name: [] for name in workers}
    for step in range(args.steps + 1):  # step 0 warms up
        for name, worker in workers.items():
            elapsed = timed(worker, exp)
            if step > 0:
                times[name].append(elapsed)
    breakdown = {name: profiled(worker, exp) for name, worker in workers.items()}
    numel = sum(p.numel() for p in workers["critic"].model.parameters())  # global numel, also when sharded
    collectives = collective_seconds(numel) if world_size() > 1 else {}
    rows = balanced_rows(exp.attention_mask.sum(-1), rank(), world_size())  # as the engine splits the batch
    my_tokens = torch.tensor([[float(exp.attention_mask[rows].sum())]])
    lengths = exp.attention_mask.sum(-1)
    result = {
        "times": times,
        "flops": {"critic": train_flops(MODEL_20M, 1, lengths), "policy": train_flops(MODEL_20M, len(tok), lengths)},
        "real_tokens": int(lengths.sum()),
        "tokens_per_rank": all_gather_rows(my_tokens).squeeze(-1).tolist(),
        # What contiguous row blocks (the split before token balancing) would have given each rank.
        "tokens_per_rank_in_blocks": [
            float(lengths[block_rows(exp.batch_size, r, world_size())].sum()) for r in range(world_size())
        ],
        "breakdown_per_rank": {name: _gather_dict(b) for name, b in breakdown.items()},
        "peak_gflops_per_rank": all_gather_rows(torch.tensor([[peak]])).squeeze(-1).tolist(),
        "gloo_collective_s_one_model_fp32": collectives,
        "model_numel": numel,
    }
    if rank() == 0:
        Path(out_path).write_text(json.dumps(result))


def _gather_dict(values: dict[str, float]) -> dict[str, list[float]]:
    """Every rank's value of each key (keys that a rank lacks count 0)."""
    keys = ("update_s", *COMM_REGIONS)
    local = torch.tensor([[values.get(k, 0.0) for k in keys]], dtype=torch.float64)
    gathered = all_gather_rows(local)
    return {k: gathered[:, i].tolist() for i, k in enumerate(keys)}


def merge_rounds(results: list[dict]) -> dict:
    """One layout's results of several rounds: step times pooled, everything else from the last round."""
    names = results[0]["times"]
    return {**results[-1], "times": {name: [t for r in results for t in r["times"][name]] for name in names}}


def summarise(layout: str, world: int, result: dict, command: str) -> dict:
    median = {name: statistics.median(t) for name, t in result["times"].items()}
    step_s = sum(median.values())
    flops = sum(result["flops"].values())
    peak = sum(result["peak_gflops_per_rank"])  # one thread per rank: the dp group's aggregate peak
    comm = {
        name: [sum(b[k][r] for k in COMM_REGIONS) for r in range(world)]
        for name, b in result["breakdown_per_rank"].items()
    }
    return {
        "layout": layout,
        "ranks": world,
        "threads_per_rank": 1,
        "step_s": step_s,
        "critic_s": median["critic"],
        "policy_s": median["policy"],
        "tokens_per_s": 2 * result["real_tokens"] / step_s,
        "gflops": flops / step_s / 1e9,
        "peak_gflops": peak,
        "pct_of_peak": 100.0 * flops / step_s / 1e9 / peak,
        **{key: result[key] for key in ("tokens_per_rank", "tokens_per_rank_in_blocks")},
        "fsdp_comm_s_per_rank": comm,
        "profiled_update_s_per_rank": {name: b["update_s"] for name, b in result["breakdown_per_rank"].items()},
        **{key: result[key] for key in ("breakdown_per_rank", "gloo_collective_s_one_model_fp32", "model_numel")},
        "step_times_s": result["times"],
        "command": command,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2, help="launches of every layout, interleaved")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per launch")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--no-packing", dest="packing", action="store_false")
    args = parser.parse_args()
    command = kernels_prefix() + (
        f"python -m bench.perf.scaling --rounds {args.rounds} --steps {args.steps} --batch {args.batch} "
        f"--micro {args.micro} --seq {args.seq}" + ("" if args.packing else " --no-packing")
    )
    load_before = os.getloadavg()
    results: dict[str, list[dict]] = {layout: [] for layout, _, _ in LAYOUTS}
    for _ in range(args.rounds):
        for layout, world, extra in LAYOUTS:
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "result.json")
                run_ranks(measure, world, args, extra, out)
                results[layout].append(json.loads(Path(out).read_text()))
    rows = [summarise(layout, world, merge_rounds(results[layout]), command) for layout, world, _ in LAYOUTS]
    for r in rows:
        r["speedup_vs_dp1"] = rows[0]["step_s"] / r["step_s"]
    speedup = rows[1]["speedup_vs_dp1"]
    print(
        f"{'layout':<28}{'step s':>8}{'critic s':>9}{'policy s':>9}{'tok/s':>7}{'GFLOP/s':>8}{'% peak':>7}"
        f"{'speed-up':>9}{'FSDP comm s, slowest rank (critic, policy)':>44}"
    )
    for r in rows:
        comm = ", ".join(f"{max(v):.2f}" for v in r["fsdp_comm_s_per_rank"].values())
        print(
            f"{r['layout']:<28}{r['step_s']:>8.2f}{r['critic_s']:>9.2f}{r['policy_s']:>9.2f}"
            f"{r['tokens_per_s']:>7.0f}{r['gflops']:>8.1f}{r['pct_of_peak']:>7.1f}{r['speedup_vs_dp1']:>9.2f}"
            f"{comm:>44}"
        )
    print(f"speed-up dp=2 / dp=1: {speedup:.2f}x; real tokens per rank at dp=2: {rows[1]['tokens_per_rank']}")
    costs = rows[1]["gloo_collective_s_one_model_fp32"]
    print(
        f"gloo, {rows[1]['model_numel'] * 4 / 2**20:.0f} MiB fp32 (one model), s: "
        + ", ".join(f"{k} {v:.3f}" for k, v in costs.items())
    )
    meta = {
        "args": vars(args),
        "model": MODEL_20M,
        "speedup": speedup,
        "load_average_before_after": [load_before, os.getloadavg()],
        "cpu_count": os.cpu_count(),
    }
    write_record(PERF / "scaling.json", {**meta, "rows": rows}, command, indent=2)


if __name__ == "__main__":
    main()
