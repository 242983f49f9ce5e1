"""Step time and per-rank parameter + optimizer memory of the policy and critic updates at dp=1, dp=2,
dp=2 replicated (HSDP, ``parallel.dp_replicate=2``) and critic tp=2 (CPU, gloo, fp32). Prints a table and
writes bench/results/perf/distributed.json.

    python -m bench.perf.distributed [--steps 5] [--hidden 256] [--layers 4] [--batch 32]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from bench.common.paths import PERF
from bench.common.record import command_line, write_record
from dtppo.distributed.comm import all_reduce, rank
from dtppo.distributed.ranks import run_ranks
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.workers.policy import PolicyWorker
from dtppo.workers.value import ValueWorker
from tests.support.harness import make_config, synthetic_experience


def _local_bytes(updater) -> int:
    """Bytes this rank holds for parameters and Adam state (local shards only)."""

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    total = sum(local(p).numel() * local(p).element_size() for p in engine.model.parameters())
    for state in engine.optimizer.state.values():
        total += sum(
            local(v).numel() * local(v).element_size() for v in state.values() if torch.is_tensor(v) and v.dim() > 0
        )
    return total


def measure(overrides: list[str], steps: int, batch: int, out_path: str) -> None:
    cfg = make_config(overrides)
    tok = build_char_tokenizer()
    policy, value = PolicyWorker(cfg, tok), ValueWorker(cfg, tok)
    exp = synthetic_experience(len(tok), batch=batch)
    exp = exp.replace(old_values=value.get_values(exp), old_logprobs=policy.get_logprobs(exp))
    times = {"critic": [], "policy": []}
    for step in range(steps + 1):  # the first step warms up (allocations, optimizer state)
        for name, worker in (("critic", value), ("policy", policy)):
            start = time.perf_counter()
            worker.train(exp)
            elapsed = float(all_reduce(torch.tensor(time.perf_counter() - start), "max"))
            if step > 0:
                times[name].append(elapsed)
    memory = {
        name: float(all_reduce(torch.tensor(float(_local_bytes(w.updater))), "max"))
        for name, w in (("critic", value), ("policy", policy))
    }
    if rank() == 0:
        torch.save({"times": times, "memory": memory}, out_path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    model = [
        f"{w}.model.tiny.{k}={v}"
        for w in ("policy", "value")
        for k, v in [("hidden_size", args.hidden), ("num_layers", args.layers), ("intermediate_size", 4 * args.hidden)]
    ]
    batch = [
        f"ppo.num_prompts_per_step={args.batch}",
        f"policy.train_global_batch_size={args.batch}",
        f"value.train_global_batch_size={args.batch}",
        "policy.train_micro_batch_size=8",
        "value.train_micro_batch_size=8",
    ]
    layouts = [
        ("dp=1", 1, []),
        ("dp=2", 2, []),
        ("dp=2 replicated", 2, [f"{w}.parallel.dp_replicate=2" for w in ("policy", "value")]),
        ("dp=1 + critic tp=2", 2, ["value.parallel.tp=2"]),
        ("critic tp=2 + SP", 2, ["value.parallel.tp=2", "value.parallel.sequence_parallel=true"]),
    ]
    rows = []
    command = command_line()
    for name, world, extra in layouts:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "r.pt")
            run_ranks(
                measure,
                world,
                [*model, *batch, *extra, f"cluster.workers_per_node={world}"],
                args.steps,
                args.batch,
                out,
            )
            result = torch.load(out, weights_only=False)
        rows.append(
            {
                "layout": name,
                "ranks": world,
                "critic_update_s": sum(result["times"]["critic"]) / args.steps,
                "policy_update_s": sum(result["times"]["policy"]) / args.steps,
                "critic_param_optim_MiB_per_rank": result["memory"]["critic"] / 2**20,
                "policy_param_optim_MiB_per_rank": result["memory"]["policy"] / 2**20,
                "command": command,
            }
        )
    header = f"{'layout':<22}{'critic s':>10}{'policy s':>10}{'critic MiB/rank':>17}{'policy MiB/rank':>17}"
    print(header)
    for r in rows:
        print(
            f"{r['layout']:<22}{r['critic_update_s']:>10.3f}{r['policy_update_s']:>10.3f}"
            f"{r['critic_param_optim_MiB_per_rank']:>17.2f}{r['policy_param_optim_MiB_per_rank']:>17.2f}"
        )
    write_record(PERF / "distributed.json", {"args": vars(args), "rows": rows}, command, indent=2)


if __name__ == "__main__":
    main()
