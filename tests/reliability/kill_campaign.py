"""The kill -9 campaign (`make reliability`): seeded random kills of tiny PPO runs, each resumed to the end
and compared exactly with an uninterrupted run of the same layout (see tests/support/killing.py for what is checked).

    python -m tests.reliability.kill_campaign [--trials 20] [--async-trials 8] [--seed 0] [--workdir DIR] [--keep]
        [--out FILE]

Trials alternate one and two ranks; then the async trials: one training rank and one generation rank,
generation two steps ahead (``ppo.max_lag=2``), 6 steps, so a kill lands with batches in flight. Each trial has
one kill (a fifth of them two: the second lands in the resumed launch). Kinds are drawn by the seeded RNG: inside a
checkpoint write (at a random fraction of the write's 4 test pauses, for a random step), at a random moment of the
run, or (two ranks) of one rank only (in the async trials: the training or the generation rank). Writes
bench/results/reliability/kill_campaign.json (or ``--out``) and prints a summary; exits 1 if any trial failed.
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

from bench.common.record import write_record
from tests.support.killing import KillPoint, RunSpec, TrialResult, reference_run, run_trial
from tests.support.recipes import REPO

STEPS = 3
RESULTS = REPO / "bench" / "results" / "reliability" / "kill_campaign.json"
ASYNC = ("cluster.generation_ranks=1", "ppo.max_lag=2", "loss.rollout_correction.importance_sampling=token")
LAYOUTS = {
    "1 rank": RunSpec(steps=STEPS, ranks=1),
    "2 ranks": RunSpec(steps=STEPS, ranks=2),
    # more steps than the others: more of its random moments fall between checkpoints with batches in flight
    "async": RunSpec(steps=2 * STEPS, ranks=2, extra=ASYNC),
}


def plan(trials: int, async_trials: int, seed: int) -> list[tuple[str, list[KillPoint]]]:
    """(layout, kill points) per trial, drawn from ``seed``: ``trials`` alternating one and two ranks, then
    ``async_trials`` on the async layout."""
    rng = random.Random(seed)
    out = []
    layouts = [["1 rank", "2 ranks"][i % 2] for i in range(trials)] + ["async"] * async_trials
    for layout in layouts:
        ranks = LAYOUTS[layout].ranks
        kinds = ["checkpoint", "time"] + (["one_rank"] if ranks == 2 else [])
        weights = [0.5, 0.35] + ([0.15] if ranks == 2 else [])
        first = rng.choices(kinds, weights)[0]
        points = [_point(first, rng, LAYOUTS[layout].steps)]
        if rng.random() < 0.2:  # a second kill, in the resumed launch: always at a random moment
            points.append(_point("time", rng, LAYOUTS[layout].steps))
        out.append((layout, points))
    return out


def _point(kind: str, rng: random.Random, steps: int) -> KillPoint:
    if kind == "checkpoint":
        return KillPoint("checkpoint", rng.random(), save=rng.randint(1, steps))
    return KillPoint(kind, rng.uniform(0.05, 0.95))


def summarise(results: list[TrialResult], layouts: list[str], seconds: float) -> dict:
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
        "trials_by_layout": dict(collections.Counter(layouts)),
        "async_trials_ok": sum(r.ok for r, layout in zip(results, layouts) if layout == "async"),
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
    parser.add_argument("--async-trials", type=int, default=8, help="trials with a generation rank, lag 2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (runs, logs)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON written (default %(default)s)")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dtppo-kill-"))
    workdir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    trials = plan(args.trials, args.async_trials, args.seed)
    used = sorted({layout for layout, _ in trials}, key=list(LAYOUTS).index)
    names = {layout: f"reference_{layout.replace(' ', '_')}" for layout in used}
    reference_s = {layout: reference_run(LAYOUTS[layout], workdir, names[layout]) for layout in used}
    print(f"references: {', '.join(f'{layout} {s:.1f}s' for layout, s in reference_s.items())}", flush=True)
    results = []
    for i, (layout, points) in enumerate(trials):
        result = run_trial(
            LAYOUTS[layout],
            workdir,
            f"trial{i:02d}",
            points,
            names[layout],
            reference_s[layout],
            rng_seed=args.seed * 1000 + i,
        )
        results.append(result)
        kills = "; ".join(
            f"{k.kind} -> {k.stage or 'not killed'} (resumed from {k.resumed_from})" for k in result.kills
        )
        print(
            f"trial {i:2d} {layout:8s} {'ok  ' if result.ok else 'FAIL'} {result.seconds:5.1f}s  {kills}"
            + (f"  problems: {result.problems}" if result.problems else ""),
            flush=True,
        )
    summary = summarise(results, [layout for layout, _ in trials], time.monotonic() - start)
    record = {
        "seed": args.seed,
        "steps": {layout: LAYOUTS[layout].steps for layout in used},
        "layouts": {layout: list(spec.args("NAME")) for layout, spec in LAYOUTS.items() if layout in used},
        "summary": summary,
        "references_s": reference_s,
        "trials": [r.to_dict() | {"layout": layout} for r, (layout, _) in zip(results, trials)],
    }
    write_record(args.out, record)
    print(json.dumps(summary, indent=1))
    print(f"wrote {args.out}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(0 if summary["trials_ok"] == summary["trials"] else 1)


if __name__ == "__main__":
    main()
