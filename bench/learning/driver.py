"""The one driver of the learning experiments. A spec (:class:`Experiment`) names a recipe, its arms (config
overrides), the seeds, the figures read from each run and how the arms compare; :func:`main` runs every arm from
every SFT model and PPO seed (``python -m dtppo ppo`` in a subprocess), aggregates over the units of replication (the
SFT models where there are several, each the mean of its PPO seeds, else the PPO seeds; bench/common/stats.py) and
writes the record (bench/common/record.py). Each SFT model is trained once (``dtppo sft``), its exit code kept beside
it; a model below its floor is left out, as every protocol says, and named in the record.

    python -m bench.learning.<module> [TABLE] [--seeds S ...] [--sft-seeds S ...] [--dry-run] [--reuse] ...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from bench.common.paths import LEARNING, REPO
from bench.common.record import write_record
from bench.common.stats import mean_ci95, paired, per_arm
from bench.learning import report
from dtppo import config as config_lib
from dtppo.launch.preflight import preflight
from dtppo.observability.logger import explained_var_mean, read_metrics

BELOW_FLOOR = 5  # dtppo sft's exit code for a model below sft.min_accuracy
QUIET = ["checkpointing.enabled=false", "logger.tensorboard=false"]
# --small: seconds per run on 2 CPU cores, with its own SFT model: a smoke test of the driver, not a result.
SMALL = """ppo.max_num_steps=2 ppo.validation.period=1 ppo.num_prompts_per_step=8 ppo.validation.max_samples=16
    ppo.validation.batch_size=16 policy.train_global_batch_size=8 policy.train_micro_batch_size=8
    value.train_global_batch_size=8 value.train_micro_batch_size=8 sft.num_steps=20 sft.scheduler.warmup_steps=2
    sft.careless_stage.num_steps=2 sft.min_accuracy=0 reward.num_workers=0 value.warmup.steps=1""".split()
INTERNAL = ("argv", "sft_argv", "env", "cfg")  # what a planned run carries for the driver, left out of the record


def run_figures(records: list[dict], run: dict) -> dict:
    """A PPO run's figures from its metrics.jsonl records: validation accuracy at the start, best and final; the
    critic's explained variance, mean over the last half of its steps; the decision-token advantage (|A| at the first
    response token, where unshifted values see the action) over the policy-training steps; seconds."""
    accuracy = [(r["step"], r["validation/accuracy"]) for r in records if "validation/accuracy" in r]
    ev_steps = [r["step"] for r in records if "train/critic/explained_var" in r]
    decision = [
        r["train/advantages/first_token_abs_mean"]
        for r in records
        if "train/advantages/first_token_abs_mean" in r and r["step"] > run["policy_start_step"]
    ]
    start, best, final = accuracy[0][1], max(a for _, a in accuracy), accuracy[-1][1]
    late, constant = explained_var_mean(records, after_step=ev_steps[-1] / 2) if ev_steps else (None, 0)
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


@dataclass(frozen=True)
class Experiment:
    """One learning experiment: every arm from every SFT model and PPO seed, compared as ``layout`` says.

    ``arms``: arm -> its overrides on the recipe (or a function of the recipe's config giving them); ``figures``: a
    run's figures from its metrics records and its planned run; ``metrics``: the figures compared per arm; ``pairs``:
    sections of paired differences (a list of (arm, arm), or one pair whose section is that difference);
    ``layout``: "table" (every arm's figures at the top, two arms' overlap and paired difference), "sections"
    (``per_arm`` and the pairs' sections) or "flat" (the one arm's figures). ``runs``: their folder (default
    runs/<name>), ``sft_root``: the SFT models' (default <runs>/sft); ``threads``: OMP_NUM_THREADS of each run (None:
    torch's default); ``env``, ``arm_fields``: each arm's environment variables and fields copied into its runs;
    ``needs``: files that must exist first, with the command that makes each; ``after``: called with every run and
    its records once all have run; ``fields``: constant fields of the record. The record is <name>.json.
    """

    name: str
    question: str
    recipe: str
    arms: dict[str, list[str]] | Callable[[config_lib.Config], dict[str, list[str]]]
    metrics: list[str]
    figures: Callable[[list[dict], dict], dict] = run_figures
    pairs: dict[str, list[tuple[str, str]] | tuple[str, str]] = field(default_factory=dict)
    layout: str = "sections"
    seeds: tuple[int, ...] = (0,)
    sft_seeds: tuple[int, ...] = ()
    runs: str = ""
    sft_root: str = ""
    threads: int | None = 1
    jobs: int = 2
    env: dict[str, dict[str, str]] = field(default_factory=dict)
    arm_fields: dict[str, dict] = field(default_factory=dict)
    needs: dict[str, str] = field(default_factory=dict)
    after: Callable[[list[dict], list[list[dict]]], None] | None = None
    fields: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Suite:
    """Experiments written as one record <name>.json: each part's figures under its name, its runs marked ``task``."""

    name: str
    question: str
    parts: dict[str, Experiment]


def folders(spec: Experiment, args: argparse.Namespace) -> tuple[Path, Path]:
    """Where the runs go and where the SFT models are: ``--out`` or ``--tag`` (a second recipe's runs) or
    ``--small`` move both; otherwise the spec's."""
    runs = Path(spec.runs or f"runs/{spec.name}")
    root = Path(args.out) if args.out else runs / args.tag if args.tag else runs
    root = root / "small" if args.small else root
    moved = args.out or args.tag or args.small
    return root, root / "sft" if moved or not spec.sft_root else Path(spec.sft_root)


def common_overrides(args: argparse.Namespace, root: Path) -> list[str]:
    """The overrides every run of this invocation shares, SFT's included."""
    small = [*SMALL, f"sft.output_dir={root / 'sft' / 'recipe'}"] if args.small else []
    steps = [] if args.steps is None else [f"ppo.max_num_steps={args.steps}"]
    return [*QUIET, *([] if args.show_output else ["logger.progress=false"]), *small, *args.set, *steps]


def plan(spec: Experiment, args: argparse.Namespace) -> list[dict]:
    """Every run (arm x SFT model x PPO seed): its overrides, validated by loading its config, and its command."""
    root, sft_root = folders(spec, args)
    recipe = str(REPO / (args.recipe or spec.recipe))  # relative names are the repository's
    common = common_overrides(args, root)
    arms = arm_overrides(spec, args)
    runs = []
    for sft_seed in args.sft_seeds or spec.sft_seeds or [None]:
        sft = [] if sft_seed is None else [f"sft.seed={sft_seed}", f"sft.output_dir={sft_root / f'seed{sft_seed}'}"]
        for arm, extra in arms.items():
            for seed in [] if args.arms and arm not in args.arms else args.seeds or spec.seeds:
                name = f"{arm}{'' if sft_seed is None else f'_sft{sft_seed}'}_seed{seed}"
                overrides = [*common, *sft, *extra, f"ppo.seed={seed}", f"logger.log_dir={root / name}"]
                runs.append(planned(spec, recipe, arm, overrides) | {"sft_argv": ["sft", recipe, *common, *sft]})
    return runs


def planned(spec: Experiment, recipe: str, arm: str, overrides: list[str]) -> dict:
    """One run as the driver carries it; a bad arm fails here, before any run starts."""
    cfg = config_lib.load(recipe, overrides)
    env = spec.env.get(arm, {})
    shown = " ".join(["python", "-m", "dtppo", "ppo", _shown(recipe), *overrides])
    return {
        "arm": arm,
        "sft_seed": cfg.sft.seed,
        "seed": cfg.ppo.seed,
        "log_dir": cfg.logger.log_dir,
        "sft_dir": cfg.sft.output_dir,
        "command": "".join(f"{k}={v} " for k, v in env.items()) + shown,
        "steps": cfg.ppo.max_num_steps,
        "policy_start_step": cfg.value.warmup.steps,
        **spec.arm_fields.get(arm, {}),
        "argv": ["ppo", recipe, *overrides],
        "env": env,
        "cfg": cfg,
    }


def _shown(path: str) -> str:
    """A path as the commands show it: relative to the repository when inside it."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(resolved)


def dtppo(argv: list[str], log: Path | None, env: dict[str, str], threads: int | None) -> int:
    """``python -m dtppo ARGV`` from the repository, its output in ``log`` (None: this terminal); its exit code."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **env, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") if log is not None else nullcontext() as out:
        return subprocess.run(
            [sys.executable, "-m", "dtppo", *argv], cwd=REPO, env=env, stdout=out, stderr=out
        ).returncode


def train_sft(run: dict) -> int:
    """The SFT model ``run`` starts from, trained once; its exit code, 0 or below-floor, kept beside it."""
    marker = REPO / Path(run["sft_dir"]).with_suffix(".exit_code")
    if not marker.is_file():
        code = dtppo(run["sft_argv"], marker.with_suffix(".log"), {}, 1)
        if code not in (0, BELOW_FLOOR):
            raise SystemExit(f"{' '.join(run['sft_argv'])} exited {code}, see {marker.with_suffix('.log')}")
        marker.write_text(str(code))
    return int(marker.read_text())


def sft_figures(sft_dir: str) -> dict:
    """The SFT model's accuracies (clean and after the careless stage) and steps, as it saved them."""
    path = REPO / sft_dir / "sft_results.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    return {f"sft_{key}": saved.get(f"sft/{key}") for key in ("accuracy", "steps", "accuracy_after_careless_stage")}


def run_ppo(run: dict, args: argparse.Namespace, threads: int | None) -> list[dict]:
    """One run (unless ``--reuse`` finds it finished): its metrics records. A run that fails has printed its one
    line (an SFT model below its floor, say): stop with its exit code."""
    log_dir = REPO / run["log_dir"]
    records = read_metrics(log_dir, missing_ok=True) if args.reuse else []
    if not any(r["step"] == run["steps"] for r in records):
        code = dtppo(run["argv"], None if args.show_output else log_dir / "run.log", run["env"], threads)
        if code:
            print(f"stopped: {run['arm']} seed {run['seed']} exited {code} ({run['log_dir']})", file=sys.stderr)
            raise SystemExit(code)
        records = read_metrics(log_dir)
    return records


def execute(spec: Experiment, args: argparse.Namespace, runs: list[dict]) -> dict:
    """The SFT models first (where the runs name several), then every run, each line printed as it ends."""
    for path, how in spec.needs.items():
        if not (REPO / path).is_file():
            raise SystemExit(f"no {path}: run {how} first")
    below = {}
    if args.sft_seeds or spec.sft_seeds:
        first = {r["sft_seed"]: r for r in runs}  # one run per SFT model names it
        with ThreadPoolExecutor(args.jobs or spec.jobs) as pool:
            codes = dict(zip(first, pool.map(train_sft, first.values())))
        below = {s: sft_figures(first[s]["sft_dir"]) for s, code in codes.items() if code != 0}
        for seed in below:
            print(f"SFT model {seed} ended below its floor (sft.min_accuracy): left out, as the protocol says")
        runs = [r for r in runs if r["sft_seed"] not in below]
    for run in {r["arm"]: r for r in runs}.values():
        preflight(run["cfg"])  # what each arm names, checked before hours of runs
    results, records = [], []
    with ThreadPoolExecutor(args.jobs or spec.jobs) as pool:
        for run, run_records in zip(runs, pool.map(lambda r: run_ppo(r, args, spec.threads), runs)):
            result = spec.figures(run_records, run)
            public = {k: v for k, v in run.items() if k not in INTERNAL}
            results.append(public | sft_figures(run["sft_dir"]) | {"result": result})
            records.append(run_records)
            accuracy = "{accuracy_start:.3f} -> {accuracy_final:.3f} (best {accuracy_best:.3f})".format(**result)
            print(f"{run['arm']} sft {run['sft_seed']} seed {run['seed']}: accuracy {accuracy}", flush=True)
    if spec.after:
        spec.after(results, records)
    models = {r["sft_seed"]: sft_figures(r["sft_dir"]) for r in results}
    return {"runs": results, "records": records, "sft_models": models, "below": below}


def arm_overrides(spec: Experiment, args: argparse.Namespace) -> dict[str, list[str]]:
    """Each arm's overrides on the recipe, as the spec gives them for this invocation."""
    if not callable(spec.arms):
        return spec.arms
    recipe = REPO / (args.recipe or spec.recipe)
    return spec.arms(config_lib.load(recipe, common_overrides(args, folders(spec, args)[0])))


def summarise(spec: Experiment, runs: list[dict]) -> dict:
    """The arms' figures over their units, laid out as ``spec.layout`` says."""
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    figures = per_arm(runs, arms, spec.metrics)
    if spec.layout == "flat":
        return figures[arms[0]]
    if spec.layout == "table":
        return table(runs, figures, spec.metrics)
    sections = {
        title: paired(runs, *pairs, spec.metrics)
        if isinstance(pairs, tuple)
        else {f"{a} - {b}": paired(runs, a, b, spec.metrics) for a, b in pairs}
        for title, pairs in spec.pairs.items()
    }
    return {"per_arm": figures, **sections}


def table(runs: list[dict], figures: dict[str, dict], metrics: list[str]) -> dict:
    """Every arm's figures; with two arms, whether their intervals overlap and their paired difference (first −
    second); the SFT models' accuracies."""
    summary = dict(figures)
    if len(figures) == 2:
        (first, a), (second, b) = figures.items()
        summary["intervals_overlap"] = {
            m: a[m]["ci95_low"] <= b[m]["ci95_high"] and b[m]["ci95_low"] <= a[m]["ci95_high"]
            for m in metrics
            if m in a and m in b and a[m]["ci95_low"] is not None and b[m]["ci95_low"] is not None
        }
        summary["paired_difference"] = paired(runs, first, second, metrics)
    models = {r["sft_seed"]: r for r in runs}.values()
    summary["sft_models"] = {
        key: mean_ci95(values)
        for key in ("sft_accuracy", "sft_accuracy_after_careless_stage")
        if (values := [m[key] for m in models if m.get(key) is not None])
    }
    return summary


def keep(done: dict, path: Path, arm: str) -> None:
    """Join to ``done`` the runs and SFT models of the earlier record at ``path`` for the SFT seeds not run now (a
    run of half an hour per SFT model is not repeated to write a combined record)."""
    earlier = json.loads(path.read_text())
    now = {r["sft_seed"] for r in done["runs"]} | set(done["below"])
    done["runs"] = sorted(
        done["runs"] + [{"arm": arm, "seed": 0} | r for r in earlier["runs"] if r["sft_seed"] not in now],
        key=lambda r: r["sft_seed"],
    )
    for key, name in (("sft_models", "sft_models"), ("below", "sft_models_below_floor")):
        older = {int(s): f for s, f in earlier.get(name, {}).items() if int(s) not in now}
        done[key] = dict(sorted((done[key] | older).items()))
    print(f"kept from {path}: the runs from SFT models {sorted({r['sft_seed'] for r in done['runs']} - now)}")


def finished(spec: Experiment, args: argparse.Namespace, runs: list[dict]) -> tuple[dict, list[dict], list[list]]:
    """Run ``runs`` and lay out their record: (the record, its runs, their metrics records)."""
    done = execute(spec, args, runs)
    if not done["runs"] and not args.keep:
        raise SystemExit("no SFT model reached its floor: nothing to compare (the protocol's outcome)")
    if args.keep:
        keep(done, args.keep, next(iter(arm_overrides(spec, args))))
    record = {
        **spec.fields,
        "recipe": _shown(str(REPO / (args.recipe or spec.recipe))),
        "seeds": list(args.seeds or spec.seeds),
        "arms": arm_overrides(spec, args),
        "sft_models": done["sft_models"],
        "sft_models_below_floor": done["below"],
        "summary": summarise(spec, done["runs"]),
        "runs": done["runs"],
    }
    show(spec, record["summary"])
    return record, done["runs"], done["records"]


def show(spec: Experiment, summary: dict) -> None:
    """The summary's table as ``spec.layout`` lays it out."""
    if spec.layout == "table":
        report.print_table(summary)
    elif spec.layout == "flat":
        report.print_sections({"all runs": summary}, {}, spec.metrics)
    else:
        report.print_sections(summary["per_arm"], {title: summary[title] for title in spec.pairs}, spec.metrics)


def parser(specs: dict[str, Experiment | Suite]) -> argparse.ArgumentParser:
    """The options every spec takes; a positional table where a module holds several specs."""
    several = len(specs) > 1
    about = "; ".join(f"{name}: {s.question}" for name, s in specs.items())
    cli = argparse.ArgumentParser(description=about if several else next(iter(specs.values())).question)
    if several:
        cli.add_argument("table", choices=list(specs))
    cli.add_argument("--seeds", type=int, nargs="+", help="PPO seeds of every arm (default: the spec's)")
    cli.add_argument("--sft-seeds", type=int, nargs="+", help="one SFT model per seed; every arm and seed from each")
    cli.add_argument("--recipe", help="another recipe (default: the spec's)")
    cli.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every run")
    cli.add_argument("--steps", type=int, help="ppo.max_num_steps (default: the recipe's)")
    cli.add_argument("--arms", nargs="+", help="only these arms")
    cli.add_argument("--jobs", type=int, help="runs side by side (default: the spec's)")
    cli.add_argument("--tag", help="a second recipe's runs and record, kept apart (<runs>/TAG, <name>_TAG.json)")
    cli.add_argument("--out", help="a folder for the runs, the record and the plot (default: runs/, bench/results/)")
    cli.add_argument("--keep", type=Path, help="an earlier record whose runs from other SFT seeds join this one")
    cli.add_argument("--reuse", action="store_true", help="keep the runs whose log already reaches the last step")
    cli.add_argument("--dry-run", action="store_true", help="validate every run's config, print its command, stop")
    cli.add_argument("--small", action="store_true", help="toy sizes: a smoke test of the driver, not a result")
    cli.add_argument("--plot", action="store_true", help="every run's curves in docs/img/<name>.png (or --out)")
    cli.add_argument("--show-output", action="store_true", help="each run's own output here, not in its run.log")
    cli.add_argument("--expect", help="a JSON of expected ranges (demo_expected.json): each run against its arm's")
    return cli


def main(specs: dict[str, Experiment | Suite], argv: list[str] | None = None) -> None:
    """Plan, run, aggregate and write the record of one of ``specs``."""
    args = parser(specs).parse_args(argv)
    spec = specs[args.table] if len(specs) > 1 else next(iter(specs.values()))
    parts = spec.parts if isinstance(spec, Suite) else {"": spec}
    plans = {task: plan(part, args) for task, part in parts.items()}
    for run in (r for runs in plans.values() for r in runs):
        print(run["command"], flush=True)
    if args.dry_run:
        return
    done = {}
    for task, part in parts.items():
        if task:
            print(f"\n== {task}: {part.recipe}", flush=True)
        done[task] = finished(part, args, plans[task])
    record = done[""][0] if "" in done else nested({task: d[0] for task, d in done.items()})
    runs, records = [r for d in done.values() for r in d[1]], [r for d in done.values() for r in d[2]]
    if args.expect:
        report.print_expected(runs, json.loads(Path(args.expect).read_text()))
    name = f"{spec.name}_{args.tag}" if args.tag else spec.name
    if args.plot:
        image = report.plot_arms(
            runs, records, (REPO / args.out if args.out else REPO / "docs" / "img") / f"{name}.png"
        )
        print(f"wrote {_shown(str(image))}")
    folder = (
        REPO / args.out if args.out else REPO / folders(next(iter(parts.values())), args)[0] if args.small else LEARNING
    )
    write_record(folder / f"{name}.json", record)
    print(f"wrote {_shown(str(folder / f'{name}.json'))}")


def nested(parts: dict[str, dict]) -> dict:
    """A suite's record: each field of its parts' records by part, the runs in one list marked with their part."""
    fields = {
        key: {task: rec[key] for task, rec in parts.items()} for key in next(iter(parts.values())) if key != "runs"
    }
    return fields | {"runs": [{"task": task, **run} for task, rec in parts.items() for run in rec["runs"]]}
