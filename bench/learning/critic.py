"""Critic experiments of issue 12, one command per table, seeds as the unit of replication.

    python -m bench.learning.critic alignment [--seeds 0 1 2 3 4]  # V(s_t) shift vs none (value.shift_values)
    python -m bench.learning.critic grpo [--seeds 0 1 2]            # PPO with critic (GAE) vs GRPO, equal samples
    python -m bench.learning.critic clean [--seeds 0 1 2]           # PPO's gain from a clean SFT model
    python -m bench.learning.critic warmup [--seeds 0]              # critic-only training: lr, epochs, batch, ...

Options: ``--recipe`` (default the demo) and ``--set k=v ...`` (overrides for every arm: the recipe of issue 12's
item 2), ``--steps``, ``--group-size`` (GRPO's samples per prompt), ``--reuse`` (keep finished runs),
``--arms A ...`` (only these arms), ``--dry-run`` (validate every arm's config and print the commands, run
nothing), ``--small`` (2 steps at toy sizes with their own SFT model: a smoke test of the runner, not a result),
``--plot`` (every run's curves overlaid in
docs/img/critic_<table>.png), ``--out DIR`` (the runs, the JSON and the plot go to DIR instead) and
``--show-output`` (each run's own progress and results table; ``make demo`` uses it), ``--tag NAME`` (a second
recipe's tables: runs under runs/critic/NAME/, files named critic_<table>_NAME.json and .png, so they neither
reuse nor overwrite another recipe's), ``--sft-seeds S ...`` (one SFT model per seed, each arm and PPO seed run from
every one: the SFT model becomes the unit of replication) and ``--expect FILE`` (each run against its arm's expected
range, written by bench/learning/expected_range.py; ``make demo`` uses it).

Every arm of a table starts from the same SFT model and differs only in its arm overrides and ``ppo.seed``; with
``--sft-seeds``, from each of the SFT models in turn.
GRPO at equal samples: ``num_prompts_per_step / G`` prompts x G samples against the critic arm's
``num_prompts_per_step`` x 1, the same number of steps, no critic warmup (GRPO has no critic to warm up); at equal
wall time: each run's last validation accuracy within the faster arm's training time, steps x median step
seconds, mean over seeds (``accuracy_at_equal_time``; medians, so a step slowed by another job does not
count). The warmup table trains the critic alone (policy frozen for the whole run), one arm per critic setting
changed from the recipe's.

Per seed: validation accuracy at the start, best and final; the critic's explained variance, mean over the last
half of its steps; the decision-token advantage, mean over the policy-training steps of
``train/advantages/first_token_abs_mean`` (|A| at the first response token, where unshifted values see the
action); training and validation seconds (for equal wall time). Per arm: mean and 95 % confidence interval
(Student t over the units: SFT models, each the mean of its PPO seeds, when there are several, else PPO seeds);
with two arms also the paired difference, unit by unit, with its interval. Writes
``bench/results/learning/critic_<table>.json`` (``--small``: under runs/critic/small/) with every command and per-seed
result, and prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

from bench.common.paths import LEARNING, REPO
from bench.common.record import write_record
from bench.common.stats import mean_ci95
from dtppo import config as config_lib
from dtppo.launch.preflight import preflight
from dtppo.observability.logger import explained_var_mean, read_metrics
from dtppo.observability.plot import curve

DEMO = REPO / "recipes" / "tiny-math-cpu.yaml"
RUNS = Path("runs") / "critic"
DEFAULT_SEEDS = {"alignment": [0, 1, 2, 3, 4], "grpo": [0, 1, 2], "clean": [0, 1, 2], "warmup": [0]}
# The warmup table's arms: one critic setting changed from the recipe's at a time.
WARMUP_ARMS = {
    "base": [],
    "lr3e-4": ["value.optimizer.lr=3e-4"],
    "lr3e-3": ["value.optimizer.lr=3e-3"],
    "epochs4": ["ppo.ppo_epochs=4"],
    "batch64": ["value.train_global_batch_size=64"],
    "batch16": ["value.train_global_batch_size=16", "value.train_micro_batch_size=16"],
    "head0": ["value.head_init_std=0"],
    "noclip": ["loss.value_clip=null"],
}
# Toy sizes for --small: seconds per run on 2 CPU cores, its own SFT model so no real one is touched.
SMALL = [
    "ppo.max_num_steps=2",
    "ppo.val_period=1",
    "ppo.num_prompts_per_step=8",
    "ppo.max_val_samples=16",
    "ppo.val_batch_size=16",
    "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=8",
    "value.train_global_batch_size=8",
    "value.train_micro_batch_size=8",
    "sft.num_steps=20",
    "sft.scheduler.warmup_steps=2",
    "sft.careless_stage.num_steps=2",
    "sft.min_accuracy=0",
    f"sft.output_dir={RUNS / 'small' / 'sft'}",
    "reward.num_workers=0",
]
METRICS = [
    "accuracy_start",
    "accuracy_best",
    "accuracy_final",
    "gain_best",
    "gain_final",
    "explained_var_last_half_mean",
    "decision_token_advantage",
    "train_seconds",
    "step_seconds_median",
    "validation_seconds",
    "accuracy_at_equal_time",
]


def summarise(records: list[dict], policy_start_step: int) -> dict:
    """One run's figures from its metrics.jsonl records (see the module docstring)."""
    accuracy = [(r["step"], r["validation/accuracy"]) for r in records if "validation/accuracy" in r]
    ev = [(r["step"], r["train/critic/explained_var"]) for r in records if "train/critic/explained_var" in r]
    decision = [
        r["train/advantages/first_token_abs_mean"]
        for r in records
        if "train/advantages/first_token_abs_mean" in r and r["step"] > policy_start_step
    ]
    start, best, final = accuracy[0][1], max(a for _, a in accuracy), accuracy[-1][1]
    late, constant = explained_var_mean(records, after_step=ev[-1][0] / 2) if ev else (None, 0)
    return {
        "accuracy_start": start,
        "accuracy_best": best,
        "accuracy_final": final,
        "gain_best": best - start,
        "gain_final": final - start,
        "explained_var_last_half_mean": late,
        "explained_var_constant_return_steps": constant,
        "decision_token_advantage": statistics.fmean(decision) if decision else None,
        "train_seconds": sum(r.get("timing/step", 0.0) for r in records),
        "step_seconds_median": statistics.median(r["timing/step"] for r in records if "timing/step" in r),
        "validation_seconds": sum(r.get("timing/validation", 0.0) for r in records),
        "accuracy_curve": accuracy,
        "accuracy_at_equal_time": None,
    }


def accuracy_within(records: list[dict], seconds: float) -> float:
    """The last validation accuracy reached within ``seconds`` of training, counting each step at the run's median
    step time (a step slowed by another job on the machine does not move the budget; validation not counted)."""
    median = statistics.median(r["timing/step"] for r in records if "timing/step" in r)
    accuracy = [(r["step"], r["validation/accuracy"]) for r in records if "validation/accuracy" in r]
    return [a for step, a in accuracy if step * median <= seconds][-1]


def arm_overrides(table: str, base: config_lib.Config, group_size: int) -> dict[str, list[str]]:
    """Each arm's overrides on top of the common ones."""
    if table == "alignment":
        return {"shift": ["value.shift_values=true"], "noshift": ["value.shift_values=false"]}
    if table == "grpo":
        prompts = base.ppo.num_prompts_per_step
        if prompts % group_size:
            raise SystemExit(f"--group-size {group_size} must divide ppo.num_prompts_per_step = {prompts}")
        return {
            "gae": ["ppo.advantage_estimator=gae"],
            "grpo": [
                "ppo.advantage_estimator=grpo",
                f"ppo.num_prompts_per_step={prompts // group_size}",
                f"ppo.num_generations_per_prompt={group_size}",
                "ppo.policy_training_start_step=0",
            ],
        }
    if table == "warmup":
        steps = base.ppo.max_num_steps
        frozen = [f"ppo.policy_training_start_step={steps}", f"ppo.val_period={steps}"]
        return {arm: [*frozen, *extra] for arm, extra in WARMUP_ARMS.items()}
    return {"clean": ["sft.careless_stage.num_steps=0", f"sft.output_dir={base.sft.output_dir}_clean"]}


def plan(args: argparse.Namespace) -> tuple[list[dict], Path]:
    """Every (arm, seed) run: its overrides, validated by loading its config, and its command line."""
    root = Path(args.out) if args.out else RUNS / "small" if args.small else RUNS / args.tag if args.tag else RUNS
    common = [*(SMALL if args.small else []), *args.set, "checkpointing.enabled=false", "logger.tensorboard=false"]
    if args.steps is not None:
        common.append(f"ppo.max_num_steps={args.steps}")
    base = config_lib.load(args.recipe, common)
    runs = []
    for sft_seed in args.sft_seeds or [None]:
        # Without --sft-seeds every run starts from the recipe's SFT model; with them, each SFT seed trains its own
        # model under the table's folder and its runs' names carry the SFT seed.
        sft = [] if sft_seed is None else [f"sft.seed={sft_seed}", f"sft.output_dir={root / 'sft' / f'seed{sft_seed}'}"]
        tag = "" if sft_seed is None else f"_sft{sft_seed}"
        for arm, extra in arm_overrides(args.table, base, args.group_size).items():
            if args.arms and arm not in args.arms:
                continue
            for seed in args.seeds:
                log_dir = root / args.table / f"{arm}{tag}_seed{seed}"
                overrides = [*common, *sft, *extra, f"ppo.seed={seed}", f"logger.log_dir={log_dir}"]
                cfg = config_lib.load(args.recipe, overrides)  # a bad arm fails here, before any run starts
                preflight(cfg)
                command = ["python", "-m", "dtppo", "ppo", _shown(args.recipe), *overrides]
                runs.append(
                    {
                        "arm": arm,
                        "sft_seed": cfg.sft.seed,
                        "seed": seed,
                        "log_dir": str(log_dir),
                        "sft_dir": cfg.sft.output_dir,
                        "command": " ".join(command),
                        "argv": command,
                        "steps": cfg.ppo.max_num_steps,
                        "policy_start_step": cfg.ppo.policy_training_start_step,
                    }
                )
    return runs, root


def _shown(path: str) -> str:
    """A path as the commands show it: relative to the repository when inside it."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(resolved)


def execute(run: dict, reuse: bool, show_output: bool) -> list[dict]:
    """Run one arm and seed (unless ``reuse`` finds it finished) and return its metrics records. A run that fails
    has printed its one line (e.g. an SFT model below its floor): stop with its exit code, no traceback."""
    log_dir = REPO / run["log_dir"]
    records = read_metrics(log_dir, missing_ok=True) if reuse else []
    if not any(r["step"] == run["steps"] for r in records):
        proc = subprocess.run(
            [sys.executable, *run["argv"][1:]], cwd=REPO, stdout=None if show_output else subprocess.DEVNULL
        )
        if proc.returncode:
            print(f"critic.py: stopped: {run['arm']} seed {run['seed']} exited {proc.returncode}", file=sys.stderr)
            raise SystemExit(proc.returncode)
        records = read_metrics(log_dir)
    return records


def sft_figures(sft_dir: str) -> dict:
    """The SFT model's accuracies (clean and after the careless stage) and steps, as it saved them."""
    path = REPO / sft_dir / "sft_results.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    return {
        "sft_accuracy": saved.get("sft/accuracy"),
        "sft_steps": saved.get("sft/steps"),
        "sft_accuracy_after_careless_stage": saved.get("sft/accuracy_after_careless_stage"),
    }


def unit_values(results: list[dict], arm: str, metric: str) -> dict[int, float] | None:
    """One value per SFT model (the unit of replication): the mean over its PPO seeds of ``metric`` in ``arm``;
    None when a run lacks the metric. With one SFT model, the units are the PPO seeds (keyed by seed)."""
    runs = [r for r in results if r["arm"] == arm]
    if any(r["result"][metric] is None for r in runs):
        return None
    if len({r.get("sft_seed") for r in runs}) == 1:
        return {r.get("seed", i): r["result"][metric] for i, r in enumerate(runs)}
    by_model: dict[int, list[float]] = {}
    for r in runs:
        by_model.setdefault(r["sft_seed"], []).append(r["result"][metric])
    return {model: statistics.fmean(values) for model, values in by_model.items()}


def compare(results: list[dict]) -> dict:
    """Per arm and metric: mean and 95 % CI over the units (SFT models when several, else PPO seeds); with two arms,
    whether their intervals overlap and the paired difference (first arm minus second, unit by unit) with its CI."""
    arms = list(dict.fromkeys(r["arm"] for r in results))
    units = {arm: {m: v for m in METRICS if (v := unit_values(results, arm, m)) is not None} for arm in arms}
    summary = {arm: {m: mean_ci95(list(v.values())) for m, v in units[arm].items()} for arm in arms}
    if len(arms) == 2:
        a, b = (summary[arm] for arm in arms)
        summary["intervals_overlap"] = {
            m: a[m]["ci95_low"] <= b[m]["ci95_high"] and b[m]["ci95_low"] <= a[m]["ci95_high"]
            for m in METRICS
            if m in a and m in b and a[m]["ci95_low"] is not None and b[m]["ci95_low"] is not None
        }
        first, second = (units[arm] for arm in arms)
        summary["paired_difference"] = {
            m: mean_ci95([first[m][k] - second[m][k] for k in first[m]])
            for m in METRICS
            if m in first and m in second and first[m].keys() == second[m].keys()
        }
    return summary


def print_table(summary: dict) -> None:
    """One row per metric, one column per arm: mean [95 % CI]; with two arms, whether the intervals overlap."""
    arms = [arm for arm in summary if arm not in ("intervals_overlap", "paired_difference", "sft_models")]
    overlap = summary.get("intervals_overlap", {})
    n = {arm: max((s["n"] for s in summary[arm].values()), default=0) for arm in arms}
    print(
        f"\n{'metric':<30}"
        + "".join(f"{f'{arm} (n={n[arm]})':>28}" for arm in arms)
        + ("  CIs overlap" if overlap else "")
    )
    for metric in dict.fromkeys(m for arm in arms for m in summary[arm]):
        cells = []
        for arm in arms:
            s = summary[arm].get(metric)
            ci = "" if s is None or s["ci95_low"] is None else f" [{s['ci95_low']:.3f}, {s['ci95_high']:.3f}]"
            cells.append("-" if s is None else f"{s['mean']:.3f}{ci}")
        flag = {True: "yes", False: "no"}.get(overlap.get(metric), "")
        print(f"{metric:<30}" + "".join(f"{c:>28}" for c in cells) + (f"  {flag:>12}" if overlap else ""))
    paired = {m: s for m, s in summary.get("paired_difference", {}).items() if s["ci95_low"] is not None}
    if paired:
        print(f"\n{f'{arms[0]} - {arms[1]}, paired by unit':<30}{'mean [95 % CI]':>28}  CI excludes 0")
        for metric, s in paired.items():
            excludes = "yes" if s["ci95_low"] > 0 or s["ci95_high"] < 0 else "no"
            cell = f"{s['mean']:+.3f} [{s['ci95_low']:+.3f}, {s['ci95_high']:+.3f}]"
            print(f"{metric:<30}{cell:>28}  {excludes:>13}")


EXPECTED_METRICS = ["accuracy_best", "accuracy_final", "decision_token_advantage"]


def expected_check(value: float, low: float, high: float) -> str:
    """``inside`` or ``OUTSIDE`` the closed range."""
    return "inside" if low <= value <= high else "OUTSIDE"


def print_expected(results: list[dict], expected: dict) -> None:
    """Each run's figures against its arm's expected range (bench/learning/expected_range.py wrote ``expected``)."""
    print(f"\nexpected on 2 CPU cores ({expected['source']}):")
    for r in results:
        ranges = expected["arms"].get(r["arm"], {})
        for metric in EXPECTED_METRICS:
            if metric in ranges and r["result"].get(metric) is not None:
                low, high = ranges[metric]
                value = r["result"][metric]
                print(
                    f"  {r['arm']:<8} {metric:<26} {value:.3f}  expected [{low:.3f}, {high:.3f}]: "
                    f"{expected_check(value, low, high)}"
                )


def _nanmean(values: list[float]) -> float:
    """Mean of the values that are not NaN; NaN when none is."""
    kept = [v for v in values if not math.isnan(v)]
    return statistics.fmean(kept) if kept else math.nan


def plot_arms(results: list[dict], records: list[list[dict]], out: Path) -> Path:
    """Validation accuracy and critic EV per step: each seed a thin line, each arm's mean over seeds a thick one.
    Steps whose EV is undefined (constant returns) are gaps in a seed's line and left out of the arm's mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    panels = [("validation/accuracy", "validation accuracy (greedy)"), ("train/critic/explained_var", "critic EV")]
    for color, arm in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], dict.fromkeys(r["arm"] for r in results)):
        runs = [run_records for r, run_records in zip(results, records) if r["arm"] == arm]
        for ax, (key, title) in zip(axes, panels):
            curves = [dict(curve(records, key)) for records in runs]
            steps = sorted(set().union(*curves))
            if not steps:
                continue
            for points in curves:
                ax.plot(steps, [points.get(s, math.nan) for s in steps], color=color, alpha=0.25, linewidth=0.8)
            means = [_nanmean([c.get(s, math.nan) for c in curves]) for s in steps]
            ax.plot(steps, means, color=color, linewidth=2, label=f"{arm} (mean of {len(curves)})")
            ax.set_title(title)
            ax.set_xlabel("PPO step")
    axes[1].set_ylim(max(axes[1].get_ylim()[0], -1.0), 1.0)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=sorted(DEFAULT_SEEDS))
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument("--recipe", default=str(DEMO))
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every arm")
    parser.add_argument("--steps", type=int, help="ppo.max_num_steps (default: the recipe's)")
    parser.add_argument("--group-size", type=int, default=4, help="GRPO samples per prompt (grpo table)")
    parser.add_argument("--reuse", action="store_true", help="keep runs whose log already reaches the last step")
    parser.add_argument("--dry-run", action="store_true", help="validate and print the commands, run nothing")
    parser.add_argument("--small", action="store_true", help="toy sizes: a smoke test of this runner")
    parser.add_argument("--plot", action="store_true", help="overlay every run's curves in docs/img/critic_<table>.png")
    parser.add_argument("--out", help="a folder for the JSON and the plot (default bench/results/ and docs/img/)")
    parser.add_argument("--show-output", action="store_true", help="show each run's own output (progress, table)")
    parser.add_argument("--tag", help="name a second recipe's runs and files (runs/critic/TAG, critic_<table>_TAG)")
    parser.add_argument(
        "--sft-seeds",
        type=int,
        nargs="+",
        help="train one SFT model per seed (sft.seed) and run every arm and seed from each",
    )
    parser.add_argument("--arms", nargs="+", help="run only these arms of the table (e.g. shift)")
    parser.add_argument(
        "--expect",
        help="a JSON of expected ranges (bench/learning/expected_range.py): whether each run is inside its arm's range",
    )
    args = parser.parse_args()
    args.seeds = args.seeds or DEFAULT_SEEDS[args.table]
    runs, root = plan(args)
    for run in runs:
        print(run["command"], flush=True)
    if args.dry_run:
        return
    results, records = [], []
    for run in runs:
        records.append(execute(run, args.reuse, args.show_output))
        result = summarise(records[-1], run["policy_start_step"])
        results.append({k: v for k, v in run.items() if k != "argv"} | sft_figures(run["sft_dir"]) | {"result": result})
        ev = result["explained_var_last_half_mean"]
        print(
            f"{run['arm']} seed {run['seed']}: start {result['accuracy_start']:.3f} "
            f"best {result['accuracy_best']:.3f}"
            f" final {result['accuracy_final']:.3f} EV(last half) {'-' if ev is None else f'{ev:+.3f}'}",
            flush=True,
        )
    if args.table == "grpo":
        budget = min(
            statistics.fmean(r["steps"] * r["result"]["step_seconds_median"] for r in results if r["arm"] == arm)
            for arm in ("gae", "grpo")
        )
        for r, run_records in zip(results, records):
            r["result"]["accuracy_at_equal_time"] = accuracy_within(run_records, budget)
    summary = compare(results)
    summary["sft_models"] = {
        key: mean_ci95(values)
        for key in ("sft_accuracy", "sft_accuracy_after_careless_stage")
        if (values := [v for v in {r["sft_seed"]: r[key] for r in results}.values() if v is not None])
    }
    print_table(summary)
    if args.expect:
        print_expected(results, json.loads(Path(args.expect).read_text()))
    name = f"{args.table}_{args.tag}" if args.tag else args.table
    if args.plot:
        image_dir = REPO / args.out if args.out else REPO / "docs" / "img"
        image = plot_arms(results, records, image_dir / f"critic_{name}.png")
        print(f"wrote {_shown(str(image))}")
    out = REPO / root / f"critic_{name}.json" if args.out or args.small else LEARNING / f"critic_{name}.json"
    write_record(
        out, {"table": args.table, "recipe": args.recipe, "seeds": args.seeds, "runs": results, "summary": summary}
    )
    print(f"wrote {_shown(str(out))}")


if __name__ == "__main__":
    main()
