"""Max abs differences between sharded and single-process workers on the same global batch (fp32, gloo).
Prints a table and writes bench/results/perf/parity.json.   python -m bench.perf.parity
"""

from __future__ import annotations

import argparse

from bench.common.paths import PERF
from bench.common.record import command_line, write_record
from dtppo.testing.workers import run, worker_round

MICRO = ["policy.train_micro_batch_size=2", "value.train_micro_batch_size=2"]
CASES = [
    ("FSDP dp=2", 2, MICRO),
    ("HSDP dp=2 (2 replicas)", 2, MICRO + [f"{w}.parallel.dp_replicate=2" for w in ("policy", "value")]),
    ("critic TP=2", 2, MICRO + ["value.parallel.tp=2"]),
    ("critic TP=2 + SP", 2, MICRO + ["value.parallel.tp=2", "value.parallel.sequence_parallel=true"]),
    ("microbatch 1 x 8 (1 rank)", 1, ["policy.train_micro_batch_size=1", "value.train_micro_batch_size=1"]),
    ("microbatch 8 x 1 (1 rank)", 1, ["policy.train_micro_batch_size=8", "value.train_micro_batch_size=8"]),
]


def _diff(a, b) -> float:
    if isinstance(a, dict):
        return max(_diff(a[k], b[k]) for k in a)
    return float((a.float() - b.float()).abs().max())


# Each column: where a worker round's result holds it.
CRITIC = {
    "values": ("values",),
    "value_loss": ("value_metrics", "loss"),
    "critic_grad_norm": ("value_metrics", "grad_norm"),
    "critic_weights": ("value_weights",),
}
POLICY = {
    "logprobs": ("logprobs",),
    "policy_loss": ("policy_metrics", "loss"),
    "policy_grad_norm": ("policy_metrics", "grad_norm"),
    "policy_weights": ("policy_weights",),
}


def _at(result: dict, path: tuple[str, ...]):
    return result[path[0]] if len(path) == 1 else result[path[0]][path[1]]


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    ref = run(worker_round, 1, MICRO)
    rows = []
    for name, world, overrides in CASES:
        got = run(worker_round, world, overrides)
        sharded_policy = "value.parallel.tp=2" not in overrides  # the TP cases shard only the critic
        diffs = {col: _diff(_at(ref, path), _at(got, path)) for col, path in CRITIC.items()}
        diffs |= {
            col: _diff(_at(ref, path), _at(got, path)) if sharded_policy else None for col, path in POLICY.items()
        }
        rows.append({"case": name, **diffs, "command": command_line()})
    print(f"{'case':<28}" + "".join(f"{c:>17}" for c in [*CRITIC, *POLICY]))
    for r in rows:
        cells = [f"{'-' if r[c] is None else format(r[c], '.2e'):>17}" for c in [*CRITIC, *POLICY]]
        print(f"{r['case']:<28}" + "".join(cells))
    write_record(PERF / "parity.json", {"rows": rows}, indent=2)


if __name__ == "__main__":
    main()
