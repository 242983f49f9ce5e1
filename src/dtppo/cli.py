"""``dtppo sft|ppo|eval|export|plot``: the command line. Bad recipes and unusable inputs (data, checkpoint or
model directories, log directories) exit 2 with one line naming the key or path; a run stopped by non-finite
numbers exits 3, one stopped by a checkpoint fault exits 4, an SFT model below its recipe's floor
(``sft.min_accuracy``) exits 5 and a run whose generation ranks died or stopped answering exits 6, each with one
line. ``DTPPO_DEBUG=1`` adds the traceback above that line."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from dtppo import config as config_lib


def _load(args: argparse.Namespace, sft: bool = False) -> config_lib.Config:
    """The recipe with its overrides, checked (with ``sft``: also for what SFT needs of it, and what it names
    outside itself, which ``PPOTrainer`` checks for the other commands)."""
    from dtppo.api.trainer import load_config
    from dtppo.launch.preflight import preflight

    cfg = load_config(args.recipe, args.overrides)
    if sft:
        config_lib.check_sft(cfg)
        preflight(cfg)
    if cfg.policy.generation.backend == "vllm":
        # Before torch starts its OpenMP pool (spawned ranks inherit it): vLLM's CPU kernels spin-wait, and two
        # threads on a busy machine slow generation 10-50x (docs/design/generation.md). An explicit setting is kept.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    return cfg


@contextlib.contextmanager
def _config_errors_reported() -> Iterator[None]:
    """A ``ConfigError`` inside becomes its one line on stderr and exit code 2."""
    from dtppo.launch.launcher import debug_traceback

    try:
        yield
    except config_lib.ConfigError as err:
        debug_traceback(err)
        print(f"dtppo: config error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def cmd_sft(args: argparse.Namespace) -> None:
    from dtppo.api.trainer import train_sft
    from dtppo.observability.report import table
    from dtppo.sft.trainer import check_floor

    cfg = _load(args, sft=True)
    results = train_sft(cfg)
    print(table("SFT", results))
    check_floor(results, cfg)


def cmd_ppo(args: argparse.Namespace) -> None:
    from dtppo.api.trainer import PPOTrainer

    results = PPOTrainer(_load(args)).train()
    if int(os.environ.get("RANK", 0)) == 0:  # torchrun starts this command once per rank
        print(results.table(), flush=True)


def cmd_eval(args: argparse.Namespace) -> None:
    from dtppo.api.trainer import PPOTrainer
    from dtppo.observability.report import table

    cfg = _load(args)
    result = PPOTrainer(cfg).evaluate()
    if result.step == 0:
        print(f"no checkpoint under {cfg.checkpointing.checkpoint_dir}: scored the starting policy", flush=True)
    figures = {"step": result.step} | ({"accuracy": result.accuracy} if result.accuracy is not None else {})
    figures |= {"reward": result.reward} | {f"reward/{name}": mean for name, mean in result.rewards.items()}
    print(table("evaluation", figures | {"avg_length": result.avg_length}))
    for prompt, response, reference, reward in result.samples[:5]:
        expected = f"expected {reference}: " if reference is not None else ""
        print(f"\nQ: {prompt}\nA: {response!r}\n{expected}reward {reward:.4g}")


def cmd_export(args: argparse.Namespace) -> None:
    from dtppo.checkpoint.export import export_checkpoint

    written = export_checkpoint(args.checkpoint_dir, args.out_dir, tuple(args.overrides))
    for path in written:
        print(f"wrote {path}")


def cmd_plot(args: argparse.Namespace) -> None:
    from dtppo.observability.plot import plot_runs

    print(f"wrote {plot_runs(args.log_dirs, args.out)}")


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


def main(argv: list[str] | None = None) -> None:
    from dtppo.launch.launcher import quiet_transformers, stops_reported

    args = build_parser().parse_args(argv)
    quiet_transformers()
    with stops_reported(), _config_errors_reported():
        args.fn(args)
