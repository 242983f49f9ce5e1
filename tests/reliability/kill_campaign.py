"""The kill -9 campaign (`make reliability`): seeded random kills of tiny PPO runs, each resumed to the end
and compared exactly with an uninterrupted run of the same layout (see killing.py for what is checked).

    python tests/reliability/kill_campaign.py [--trials 20] [--seed 0] [--workdir DIR] [--keep]

Trials alternate one and two ranks. Each trial has one kill (a fifth of them two: the second lands in the
resumed launch). Kinds are drawn by the seeded RNG: inside a checkpoint write (at a random fraction of the
write's 4 test pauses, for a random step), at a random moment of the run, or (two ranks) of one rank only.
Writes bench/results/kill_campaign.json and prints a summary; exits 1 if any trial failed.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from killing import REPO, KillPoint, RunSpec, TrialResult, reference_run, run_trial  # noqa: E402

STEPS = 3
RESULTS = REPO / "bench" / "results" / "kill_campaign.json"


def plan(trials: int, seed: int) -> list[tuple[int, list[KillPoint]]]:
    """(ranks, kill points) per trial, drawn from ``seed``."""
    rng = random.Random(seed)
    out = []
    for i in range(trials):
        ranks = 1 + i % 2
        kinds = ["checkpoint", "time"] + (["one_rank"] if ranks == 2 else [])
        weights = [0.5, 0.35] + ([0.15] if ranks == 2 else [])
        first = rng.choices(kinds, weights)[0]
        points = [_point(first, rng)]
        if rng.random() < 0.2:  # a second kill, in the resumed launch: always at a random moment
            points.append(_point("time", rng))
        out.append((ranks, points))
    return out


def _point(kind: str, rng: random.Random) -> KillPoint:
    if kind == "checkpoint":
        return KillPoint("checkpoint", rng.random(), save=rng.randint(1, STEPS))
    return KillPoint(kind, rng.uniform(0.05, 0.95))


def summarise(results: list[TrialResult], seconds: float) -> dict:
    kills = [k for r in results for k in r.kills]
    landed = [k for k in kills if k.killed]
    stages = collections.Counter(k.stage.split(": ", 1)[-1] if k.stage.startswith("tmp_") else k.stage for k in landed)
    resumed_right = sum(
        1
        for r in results
        for i, k in enumerate(r.kills)
        if k.killed and f"kill {i}: resumed" not in " ".join(r.problems)
    )
    return {
        "trials": len(results),
        "trials_ok": sum(r.ok for r in results),
        "trials_by_ranks": dict(collections.Counter(r.ranks for r in results)),
        "kills_planned": len(kills),
        "kills_landed": len(landed),
        "kills_by_kind": dict(collections.Counter(k.kind for k in landed)),
        "kills_inside_a_checkpoint_write": sum(k.stage.startswith("tmp_step_") for k in landed),
        "stage_at_kill": dict(stages),
        "resumed_from_latest_complete": f"{resumed_right}/{len(landed)}",
        "resumed_fresh_no_checkpoint_yet": sum(k.resumed_from == 0 for k in landed),
        "half_written_left_at_kill": sum(any(t.startswith("tmp_step_") for t in k.tmp_dirs) for k in landed),
        "metrics_equal": sum(r.metrics_equal for r in results),
        "weights_equal": sum(r.weights_equal for r in results),
        "max_metric_abs_diff": max((r.max_metric_abs_diff for r in results), default=float("nan")),
        "max_weight_abs_diff": max((r.max_weight_abs_diff for r in results), default=float("nan")),
        "leftover_processes": sum(k.leftover_processes for k in landed),
        "restarted_trials": sum(r.restarts > 0 for r in results),
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (runs, logs)")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dtppo-kill-"))
    workdir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    specs = {ranks: RunSpec(steps=STEPS, ranks=ranks) for ranks in (1, 2)}
    reference_s = {ranks: reference_run(spec, workdir, f"reference{ranks}") for ranks, spec in specs.items()}
    print(f"references: {', '.join(f'{r} rank(s) {s:.1f}s' for r, s in reference_s.items())}", flush=True)
    results = []
    for i, (ranks, points) in enumerate(plan(args.trials, args.seed)):
        result = run_trial(
            specs[ranks],
            workdir,
            f"trial{i:02d}",
            points,
            f"reference{ranks}",
            reference_s[ranks],
            rng_seed=args.seed * 1000 + i,
        )
        results.append(result)
        kills = "; ".join(
            f"{k.kind} -> {k.stage or 'not killed'} (resumed from {k.resumed_from})" for k in result.kills
        )
        print(
            f"trial {i:2d} ranks={ranks} {'ok  ' if result.ok else 'FAIL'} {result.seconds:5.1f}s  {kills}"
            + (f"  problems: {result.problems}" if result.problems else ""),
            flush=True,
        )
    summary = summarise(results, time.monotonic() - start)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "seed": args.seed,
                "steps": STEPS,
                "summary": summary,
                "references_s": reference_s,
                "trials": [r.to_dict() for r in results],
            },
            indent=1,
        )
    )
    print(json.dumps(summary, indent=1))
    print(f"wrote {RESULTS}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(0 if summary["trials_ok"] == summary["trials"] else 1)


if __name__ == "__main__":
    main()
