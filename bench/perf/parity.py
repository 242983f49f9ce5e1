"""Max abs differences between sharded and single-process workers on the same global batch (fp32, gloo).
Prints a table and writes bench/results/perf/parity.json.   python -m bench.perf.parity
"""

from __future__ import annotations

from bench.common.paths import PERF
from bench.common.record import command_line, write_record
from tests.support.harness import run, worker_round

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


def main() -> None:
    ref = run(worker_round, 1, MICRO)
    rows = []
    for name, world, overrides in CASES:
        got = run(worker_round, world, overrides)
        policy_checked = "value.parallel.tp=2" not in overrides  # the TP cases shard only the critic
        rows.append(
            {
                "case": name,
                "values": _diff(ref["values"], got["values"]),
                "value_loss": _diff(ref["value_metrics"]["loss"], got["value_metrics"]["loss"]),
                "critic_grad_norm": _diff(ref["value_metrics"]["grad_norm"], got["value_metrics"]["grad_norm"]),
                "critic_weights": _diff(ref["value_weights"], got["value_weights"]),
                "logprobs": _diff(ref["logprobs"], got["logprobs"]) if policy_checked else None,
                "policy_loss": _diff(ref["policy_metrics"]["loss"], got["policy_metrics"]["loss"])
                if policy_checked
                else None,
                "policy_grad_norm": _diff(ref["policy_metrics"]["grad_norm"], got["policy_metrics"]["grad_norm"])
                if policy_checked
                else None,
                "policy_weights": _diff(ref["policy_weights"], got["policy_weights"]) if policy_checked else None,
                "command": command_line(),
            }
        )
    cols = [
        "values",
        "value_loss",
        "critic_grad_norm",
        "critic_weights",
        "logprobs",
        "policy_loss",
        "policy_grad_norm",
        "policy_weights",
    ]
    print(f"{'case':<28}" + "".join(f"{c:>17}" for c in cols))
    for r in rows:
        print(f"{r['case']:<28}" + "".join(f"{'-' if r[c] is None else format(r[c], '.2e'):>17}" for c in cols))
    write_record(PERF / "parity.json", {"rows": rows}, indent=2)


if __name__ == "__main__":
    main()
