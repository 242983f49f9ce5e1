"""A model (not a measurement) of asynchronous PPO's speed-up at scale, from the phase times bench/perf/async_ppo.py
measured.

    python -m bench.perf.async_model [--results bench/results/perf/async.json] [--gpus 8] \
        [--out bench/results/perf/async_model.json]

Per step, from one generation rank and one training rank of the split synchronous arm: G1, the generation ranks'
sampling time (timing/generation_busy), and T1, the trainer's own time (timing/step − timing/generation_wait, the
weight gather and post included). With N generating and M training devices, sampling taking G1 / N^a (a = 1:
perfect; a < 1: decoding a smaller share of the batch per device is latency-bound, measured a ≈ 0.2 on CPU at 8
prompts) and training T1 / M^b:

    colocated, synchronous, on N + M devices:  G1 / (N + M)^a + T1 / (N + M)^b
    split, synchronous (ppo.max_lag = 0):       G1 / N^a + T1 / M^b
    split, asynchronous (ppo.max_lag >= 1):     max(G1 / N^a, T1 / M^b)

The asynchronous form assumes enough batches in flight to absorb step-to-step variation (k = 2 measured it; k = 1
fell short, docs/performance.md). Weight transfer, validation and checkpoints are left out of all three.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common.paths import PERF
from bench.common.record import command_line, write_record


def step_times(g1: float, t1: float, n: int, m: int, a: float, b: float) -> dict[str, float]:
    return {
        "colocated": g1 / (n + m) ** a + t1 / (n + m) ** b,
        "split_sync": g1 / n**a + t1 / m**b,
        "async": max(g1 / n**a, t1 / m**b),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=PERF / "async.json")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--out", type=Path, default=PERF / "async_model.json")
    args = parser.parse_args()
    measured = json.loads(args.results.read_text())["summary"]
    command = command_line()
    rows = []
    header = f"{'workload':9s} {'G1:T1':>6s} {'a':>4s} {'N':>2s} {'M':>2s}"
    print(f"{header} {'async/split-sync':>17s} {'async/colocated':>16s}")
    for row in measured:
        if row["arm"] != "split-sync":
            continue
        phases = row["median_phase_s"]
        g1 = phases["timing/generation_busy"]
        t1 = phases["timing/step"] - phases["timing/generation_wait"]
        for a in (1.0, 0.5):
            for n in range(1, args.gpus):
                m = args.gpus - n
                times = step_times(g1, t1, n, m, a, 1.0)
                rows.append(
                    {
                        "workload": row["workload"],
                        "G1_s": g1,
                        "T1_s": t1,
                        "a": a,
                        "b": 1.0,
                        "generation_devices": n,
                        "training_devices": m,
                        "async_vs_split_sync": times["split_sync"] / times["async"],
                        "async_vs_colocated": times["colocated"] / times["async"],
                        "command": command,
                    }
                )
                r = rows[-1]
                print(
                    f"{r['workload']:9s} {g1 / t1:6.2f} {a:4.1f} {n:2d} {m:2d} {r['async_vs_split_sync']:17.2f} "
                    f"{r['async_vs_colocated']:16.2f}"
                )
    write_record(args.out, {"model": __doc__, "rows": rows}, command)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
