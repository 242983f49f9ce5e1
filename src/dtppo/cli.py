"""``dtppo sft|ppo|eval|export|plot``: the command line. Bad recipes and unusable inputs (data, checkpoint or
model directories, log directories) exit 2 with one line naming the key or path; a run stopped by non-finite
numbers exits 3, one stopped by a checkpoint fault exits 4, an SFT model below its recipe's floor
(``sft.min_accuracy``) exits 5 and a run whose generation ranks died or stopped answering exits 6, each with one
line. ``DTPPO_DEBUG=1`` adds the traceback above that line."""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from dtppo import config as config_lib
from dtppo.config.reward_spec import parse_spec
from dtppo.errors import CheckpointError, GenerationError, InputError, NonFiniteError, RunStopped

if TYPE_CHECKING:  # the launchers import torch; the CLI imports them only when it starts ranks
    from dtppo.launch.launcher import RankLauncher

DEBUG_ENV = "DTPPO_DEBUG"


def _load(args: argparse.Namespace, sft: bool = False) -> config_lib.Config:
    """The recipe with its overrides, checked (with ``sft``: also for what SFT needs of it)."""
    from dtppo.launch.preflight import preflight

    try:
        cfg = config_lib.load(args.recipe, args.overrides)
        if sft:
            config_lib.check_sft(cfg)
        preflight(cfg)
    except config_lib.ConfigError as err:
        _config_error(err)
    if cfg.policy.generation.backend == "vllm":
        # Before torch starts its OpenMP pool (spawned ranks inherit it): vLLM's CPU kernels spin-wait, and two
        # threads on a busy machine slow generation 10-50x (docs/design.md). An explicit setting is kept.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    return cfg


def _config_error(err: config_lib.ConfigError) -> None:
    _debug_traceback(err)
    print(f"dtppo: config error: {err}", file=sys.stderr)
    raise SystemExit(2) from None


def cmd_sft(args: argparse.Namespace) -> None:
    from dtppo.sft.trainer import check_floor

    cfg = _load(args, sft=True)
    results = _train_sft(cfg)
    print(_table("SFT", results))
    check_floor(results, cfg)


def cmd_ppo(args: argparse.Namespace) -> None:
    from dtppo.distributed.launch import under_torchrun
    from dtppo.sft.trainer import check_floor, saved_results, sft_is_done

    cfg = _load(args)
    sft_results = {}
    if cfg.ppo.init_from_sft and not sft_is_done(cfg):
        if under_torchrun():
            raise InputError(f"sft.output_dir: {cfg.sft.output_dir} is missing: run `dtppo sft` before launching ranks")
        try:
            config_lib.check_sft(cfg)
        except config_lib.ConfigError as err:
            _config_error(err)
        print(f"no SFT checkpoint at {cfg.sft.output_dir}: running SFT first", flush=True)
        sft_results = _train_sft(cfg)
    elif cfg.ppo.init_from_sft:
        sft_results = saved_results(cfg)
    check_floor(sft_results, cfg)
    _launch(_launcher(cfg.cluster), _rank, _ppo_rank, _absolute_paths(cfg.to_dict()), sft_results)


def _train_sft(cfg: config_lib.Config) -> dict[str, float]:
    """SFT on the policy's ranks (``sft.run_sft``); the results it saved with the model."""
    from dtppo.sft.trainer import saved_results

    cluster, policy_ranks = cfg.cluster, len(cfg.cluster.pool("policy"))
    if policy_ranks != cluster.world_size:  # the critic's or the generation ranks have no part in SFT
        cluster = dataclasses.replace(
            cluster, num_nodes=1, workers_per_node=policy_ranks, policy_ranks=0, generation_ranks=0
        )
    _launch(_launcher(cluster), _rank, _sft_rank, _absolute_paths(cfg.to_dict()))
    return saved_results(cfg)


def _launch(launcher: RankLauncher, fn: Callable[..., None], *args) -> None:
    """``fn(*args)`` on every rank of ``launcher``; a rank that stopped the run on purpose printed why, and this
    process exits with its code."""
    try:
        launcher.run(fn, *args)
    except RunStopped:  # the launcher's own (a generation rank that died): main() prints it
        raise
    except Exception as err:
        # A spawned rank that stopped with a RunStopped has printed why and exited with its code.
        if getattr(err, "exit_code", None) in (
            InputError.exit_code,
            NonFiniteError.exit_code,
            CheckpointError.exit_code,
            GenerationError.exit_code,
        ):
            raise SystemExit(err.exit_code) from None
        raise
    finally:
        launcher.shutdown()


def _absolute_paths(tree: dict) -> dict:
    """Ranks may run in another working directory (Ray workers do): anchor every local path at ours.
    Output paths always; input paths only when they exist here, so hub names like "Qwen/..." stay names."""
    tree = copy.deepcopy(tree)
    outputs = [("logger", "log_dir"), ("checkpointing", "checkpoint_dir"), ("sft", "output_dir")]
    inputs = [
        ("policy", "model", "path"),
        ("value", "model", "path"),
        ("reward", "model", "path"),
        ("data", "train", "path"),
        ("data", "validation", "path"),
    ]
    for keys in outputs + inputs:
        *parents, leaf = keys
        node = functools.reduce(lambda section, key: section.setdefault(key, {}), parents, tree)
        value = node.get(leaf)
        if value is not None and (keys in outputs or Path(value).exists()):
            node[leaf] = str(Path(value).resolve())
    reward = tree.setdefault("reward", {})
    if reward.get("functions"):
        reward["functions"] = [parse_spec(spec).absolute() for spec in reward["functions"]]
    return tree


def _launcher(cluster: config_lib.ClusterConfig) -> RankLauncher:
    """Where the ranks run: this machine (local processes / torchrun) or Ray actors."""
    if cluster.backend == "ray":
        from dtppo.launch.ray import RayLauncher

        launcher = RayLauncher(cluster, cluster.ray_temp_dir)
        print(
            "ranks placed on Ray nodes: "
            + ", ".join(f"rank {r} -> {node}" for r, node in enumerate(launcher.rank_nodes())),
            flush=True,
        )
        return launcher
    from dtppo.launch.launcher import LocalLauncher

    # what every rank imports, loaded once in the process local ranks are forked from
    return LocalLauncher(
        cluster.world_size, cluster.generation_ranks, preload=("dtppo.ppo.trainer", "dtppo.sft.trainer")
    )


def _rank(fn: Callable[..., None], *args) -> None:
    """One launched rank running ``fn(*args)`` (module level so spawned processes can import it). A stop is printed
    on the rank that saw it, which then exits with its code: a spawned rank's exception would reach the user as a
    traceback."""
    _quiet_transformers()
    with _stops_reported():
        fn(*args)


def _sft_rank(tree: dict) -> None:
    """One rank of SFT."""
    from dtppo.sft.trainer import run_sft

    run_sft(config_lib.from_dict(tree))


def _ppo_rank(tree: dict, sft_results: dict) -> None:
    """One rank of a PPO run: a training rank, or a generation rank (``cluster.generation_ranks``), which serves the
    training ranks until they are done."""
    from dtppo.distributed.comm import is_main_rank
    from dtppo.distributed.launch import run_worlds

    cfg = config_lib.from_dict(tree)
    worlds = run_worlds()
    if worlds is not None and worlds.generation_rank is not None:
        from dtppo.generation.remote import serve

        serve(cfg)
        return
    from dtppo.ppo.trainer import PPOTrainer

    history = PPOTrainer(cfg).fit()
    if is_main_rank():
        print(_results_table(cfg, sft_results, history), flush=True)


@contextlib.contextmanager
def _stops_reported() -> Iterator[None]:
    """A ``RunStopped`` inside becomes its one line on stderr and its exit code."""
    try:
        yield
    except RunStopped as err:
        _report(err)
        raise SystemExit(err.exit_code) from None


def _report(err: RunStopped) -> None:
    """The one line a stopped run leaves on stderr (prefixed with the rank when there are several)."""
    from dtppo.distributed.comm import rank, world_size
    from dtppo.distributed.launch import run_worlds

    worlds = run_worlds()
    if worlds is not None:  # two worlds: name the rank among all launched ones, and its side
        side = "training" if worlds.generation_rank is None else f"generation rank {worlds.generation_rank}"
        where = f" (rank {worlds.global_rank}, {side})"
    else:
        where = f" (rank {rank()})" if world_size() > 1 else ""
    _debug_traceback(err)
    print(f"dtppo: error{where}: {err}", file=sys.stderr, flush=True)


def _debug_traceback(err: BaseException) -> None:
    if os.environ.get(DEBUG_ENV) == "1":
        traceback.print_exception(err, file=sys.stderr)


def cmd_eval(args: argparse.Namespace) -> None:
    from dtppo.ppo.trainer import PPOTrainer
    from dtppo.sft.trainer import sft_is_done

    # Evaluation samples in this one process: no generation ranks, nothing to run ahead of.
    args.overrides = [*args.overrides, "cluster.generation_ranks=0", "ppo.max_lag=0"]
    cfg = _load(args)
    if cfg.ppo.init_from_sft and not sft_is_done(cfg):
        raise InputError(
            f"sft.output_dir: no SFT model at {cfg.sft.output_dir} (ppo.init_from_sft is true): run `dtppo sft` first"
        )
    trainer = PPOTrainer(cfg)
    trainer.maybe_resume()
    if trainer.steps_done == 0:
        print(f"no checkpoint under {cfg.checkpointing.checkpoint_dir}: scoring the starting policy", flush=True)
    result = trainer.evaluate()
    trainer.rollouts.close()
    trainer.rewarder.close()
    figures = {"step": trainer.steps_done} | ({"accuracy": result.accuracy} if result.accuracy is not None else {})
    figures |= {"reward": result.reward} | {f"reward/{name}": mean for name, mean in result.rewards.items()}
    print(_table("evaluation", figures | {"avg_length": result.avg_length}))
    for prompt, response, reference, reward in result.samples[:5]:
        expected = f"expected {reference}: " if reference is not None else ""
        print(f"\nQ: {prompt}\nA: {response!r}\n{expected}reward {reward:.4g}")


def cmd_export(args: argparse.Namespace) -> None:
    from dtppo.checkpoint.export import export_checkpoint

    try:
        written = export_checkpoint(args.checkpoint_dir, args.out_dir, tuple(args.overrides))
    except config_lib.ConfigError as err:  # an export.* key of the command
        _config_error(err)
    for path in written:
        print(f"wrote {path}")


def cmd_plot(args: argparse.Namespace) -> None:
    from dtppo.observability.plot import plot_runs

    print(f"wrote {plot_runs(args.log_dirs, args.out)}")


def _table(title: str, values: dict) -> str:
    width = max(len(k) for k in values)
    lines = [f"{title}", "-" * (width + 14)]
    lines += [
        f"{k:<{width}}  {v:>10.4f}" if isinstance(v, float) else f"{k:<{width}}  {v:>10}" for k, v in values.items()
    ]
    return "\n".join(lines)


def _results_table(cfg: config_lib.Config, sft_results: dict, history: list[dict]) -> str:
    """The demo's summary: accuracy before (when step 0 was validated) and after PPO and the critic's fit over
    the run."""
    from dtppo.observability.logger import explained_var_defined, explained_var_mean, read_metrics

    records = read_metrics(cfg.logger.log_dir)
    val = [(r["step"], r["validation/accuracy"]) for r in records if "validation/accuracy" in r]
    val_reward = [(r["step"], r["validation/reward"]) for r in records if "validation/reward" in r]
    ev = [
        (r["step"], r["train/critic/explained_var"] if explained_var_defined(r) else "n/a")
        for r in records
        if "train/critic/explained_var" in r
    ]
    rows = dict(sft_results) | _start_and_end("validation accuracy", val)
    if val:
        if val[0][0] == 0 and val[-1][0] > 0:
            rows["PPO gain (points)"] = 100 * (val[-1][1] - val[0][1])
        rows["best validation accuracy"] = max(a for _, a in val)
    if cfg.reward.accuracy_from is None:  # a task without a verifier: its reward is the figure
        rows |= _start_and_end("validation reward", val_reward)
    if ev:
        late, constant = explained_var_mean(records, after_step=ev[-1][0] / 2)
        rows["critic explained variance, first step"] = ev[0][1]
        rows["critic explained variance, mean of last half"] = "n/a" if late is None else late
        if constant:
            rows["last-half steps with constant returns (EV undefined, left out)"] = constant
    if history:
        rows["mean PPO step time (s)"] = sum(h["timing/step"] for h in history) / len(history)
    return _table("dtppo results", rows)


def _start_and_end(name: str, measured: list[tuple[int, float]]) -> dict[str, float]:
    """The first and last of ``measured`` (step, value), each labelled by its step: "at start" only for a value
    measured at step 0 (none with ``ppo.val_at_start=false``), "at end" only after it."""
    rows = {f"{name} at start (step 0)": measured[0][1]} if measured and measured[0][0] == 0 else {}
    if measured and measured[-1][0] > 0:
        rows[f"{name} at end (step {measured[-1][0]})"] = measured[-1][1]
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dtppo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, help_text in [
        ("sft", cmd_sft, "supervised fine-tuning; writes sft.output_dir"),
        ("ppo", cmd_ppo, "PPO training (runs SFT first when ppo.init_from_sft and it is missing)"),
        ("eval", cmd_eval, "score the latest checkpoint (or the starting policy) on the validation set"),
    ]:
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("recipe", type=Path)
        cmd.add_argument("overrides", nargs="*", help="section.key=value")
        cmd.set_defaults(fn=fn)
    export = sub.add_parser("export", help="write HF safetensors for the policy and the critic")
    export.add_argument("checkpoint_dir", type=Path)
    export.add_argument("out_dir", type=Path)
    export.add_argument("overrides", nargs="*", help="export.key=value (e.g. export.dtype=bfloat16)")
    export.set_defaults(fn=cmd_export)
    plot = sub.add_parser("plot", help="write PNG curves from LOG_DIR/metrics.jsonl (several runs overlaid)")
    plot.add_argument("log_dirs", type=Path, nargs="+")
    plot.add_argument("--out", type=Path, default=None, help="PNG path (default: FIRST_LOG_DIR/curves.png)")
    plot.set_defaults(fn=cmd_plot)
    return parser


def _quiet_transformers() -> None:
    """No per-file progress bars from transformers in logs (each spawned rank or actor calls this too)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    _quiet_transformers()
    with _stops_reported():
        args.fn(args)
