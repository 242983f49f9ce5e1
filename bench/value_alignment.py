"""Value-alignment experiment: the tiny recipe with the critic's V(s_t) shift and without it, several seeds.

Without the shift the critic's value at position t is read from the hidden state *after* token t, i.e. it
sees the token it is supposed to value. This is the convention the reference implementation had to fix; the
experiment measures what it costs. Every run starts from the same SFT checkpoint (the demo's, built first if
missing) and differs only in ``ppo.seed`` and ``value.shift_values``.

    python bench/value_alignment.py [--seeds 0 1 2] [--steps 40]

Prints a table, writes bench/results/value_alignment.json and docs/img/value_alignment.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "tiny-math-cpu.yaml"
OUT_DIR = REPO / "runs" / "value_alignment"


def ppo_command(seed: int, shift: bool, steps: int) -> list[str]:
    name = f"{'shift' if shift else 'noshift'}_seed{seed}"
    return [sys.executable, "-m", "dtppo", "ppo", str(RECIPE), f"ppo.seed={seed}", f"ppo.max_num_steps={steps}",
            f"value.shift_values={str(shift).lower()}", f"logger.log_dir={OUT_DIR / name}",
            "checkpointing.enabled=false", "logger.tensorboard=false"]


def read_log(log_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _finished(log_dir: Path, steps: int) -> bool:
    return (log_dir / "metrics.jsonl").exists() and any(r["step"] == steps for r in read_log(log_dir))


def summarise(records: list[dict]) -> dict:
    accuracy = [(r["step"], r["validation/accuracy"]) for r in records if "validation/accuracy" in r]
    ev = [(r["step"], r["train/critic/explained_var"]) for r in records if "train/critic/explained_var" in r]
    last_half = [v for s, v in ev if s > ev[-1][0] / 2]
    return {
        "accuracy_start": accuracy[0][1], "accuracy_end": accuracy[-1][1],
        "accuracy_best": max(v for _, v in accuracy), "accuracy_curve": accuracy,
        "explained_var_first": ev[0][1], "explained_var_last_half_mean": statistics.fmean(last_half),
        "explained_var_curve": ev,
    }


def plot(runs: dict[str, dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, ev_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for name, run in runs.items():
        color = "tab:blue" if name.startswith("shift") else "tab:red"
        label = ("V(s_t) shift (dtppo)" if name.startswith("shift") else "no shift") if name.endswith("seed0") else None
        acc_ax.plot(*zip(*run["accuracy_curve"]), color=color, alpha=0.7, marker="o", label=label)
        ev_ax.plot(*zip(*run["explained_var_curve"]), color=color, alpha=0.5, label=label)
    acc_ax.set(title="validation accuracy (greedy)", xlabel="PPO step")
    ev_ax.set(title="critic explained variance", xlabel="PPO step", ylim=(-1.0, 1.0))
    for ax in (acc_ax, ev_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--reuse", action="store_true", help="keep runs whose log already reaches --steps")
    args = parser.parse_args()
    runs, rows = {}, []
    for seed in args.seeds:
        for shift in (True, False):
            command = ppo_command(seed, shift, args.steps)
            name = Path(command[-3].split("=", 1)[1]).name
            if not (args.reuse and _finished(OUT_DIR / name, args.steps)):
                subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
            runs[name] = summarise(read_log(OUT_DIR / name))
            rows.append({"run": name, "command": " ".join(command[1:]).replace(str(REPO) + "/", ""),
                         **{k: v for k, v in runs[name].items() if not k.endswith("_curve")}})
            print(f"{name}: best {runs[name]['accuracy_best']:.3f} end {runs[name]['accuracy_end']:.3f} "
                  f"EV(last half) {runs[name]['explained_var_last_half_mean']:+.3f}", flush=True)
    print(f"\n{'run':<16}{'acc start':>10}{'acc best':>10}{'acc end':>10}{'EV first':>10}{'EV 2nd half':>12}")
    for row in rows:
        print(f"{row['run']:<16}{row['accuracy_start']:>10.3f}{row['accuracy_best']:>10.3f}"
              f"{row['accuracy_end']:>10.3f}{row['explained_var_first']:>10.3f}"
              f"{row['explained_var_last_half_mean']:>12.3f}")
    for label, prefix in (("shift", "shift_"), ("no shift", "noshift_")):
        group = [r for r in rows if r["run"].startswith(prefix)]
        print(f"mean {label:<11}{'':>10}{statistics.fmean(r['accuracy_best'] for r in group):>10.3f}"
              f"{statistics.fmean(r['accuracy_end'] for r in group):>10.3f}{'':>10}"
              f"{statistics.fmean(r['explained_var_last_half_mean'] for r in group):>12.3f}")
    results = REPO / "bench" / "results" / "value_alignment.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps({"rows": rows, "curves": runs}, indent=1))
    plot(runs, REPO / "docs" / "img" / "value_alignment.png")
    print(f"wrote {results.relative_to(REPO)} and docs/img/value_alignment.png")


if __name__ == "__main__":
    main()
