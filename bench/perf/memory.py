"""Peak resident memory of `dtppo ppo` on the tiny CPU recipe for one PPO step, in one process and on 2 local ranks,
next to the floor of a process that only imports the stack. Each row is a fresh child process; its peak is
getrusage(RUSAGE_CHILDREN)'s, the largest single process among the children, not a sum. Prints a table and writes
bench/results/perf/memory.json. The other memory benchmarks: memory_vocab, memory_features, memory_lora.

    python -m bench.perf.memory
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time

from bench.common.paths import PERF, REPO
from bench.common.record import kernels_prefix, write_record

DTPPO = [sys.executable, "-m", "dtppo"]
IMPORTS = "import torch, transformers, dtppo.cli, dtppo.ppo.trainer"


def ppo_step(tmp: str, ranks: int) -> list[str]:
    """One PPO step of the demo recipe from a fresh (not SFT-initialised) tiny model, validation included;
    with 2 ranks each trains half of the recipe's 32-sample minibatch in one microbatch."""
    micro = [f"{w}.train_micro_batch_size={32 // ranks}" for w in ("policy", "value")]
    return [
        *DTPPO,
        "ppo",
        "recipes/tiny-math-cpu.yaml",
        "ppo.max_num_steps=1",
        "ppo.init_from_sft=false",
        f"cluster.workers_per_node={ranks}",
        *micro,
        f"logger.log_dir={tmp}/log",
        "logger.progress=false",
        f"checkpointing.checkpoint_dir={tmp}/ckpt",
    ]


def peak_rss_mib(cmd: list[str]) -> tuple[float, float]:
    """Run ``cmd`` in a child with a fresh rusage account; returns (peak RSS MiB, wall s)."""
    probe = (
        "import resource, subprocess, sys, time; t = time.perf_counter(); "
        "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", probe, *cmd], cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    rss, wall = out.stdout.split()[-2:]
    return float(rss), float(wall)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    rows = []
    command = kernels_prefix() + "python -m bench.perf.memory"
    with tempfile.TemporaryDirectory() as tmp:
        cases = [
            ("import floor (torch + transformers + dtppo)", [sys.executable, "-c", IMPORTS]),
            ("tiny-math-cpu PPO, 1 step, 1 process", ppo_step(f"{tmp}/a", 1)),
            ("tiny-math-cpu PPO, 1 step, 2 ranks (largest)", ppo_step(f"{tmp}/b", 2)),
        ]
        for name, cmd in cases:
            rss, wall = peak_rss_mib(cmd)
            shown = " ".join(cmd).replace(sys.executable, "python").replace(tmp, "$TMP")
            rows.append({"case": name, "peak_rss_MiB": rss, "wall_s": wall, "run": shown, "command": command})
    print(f"{'case':<48}{'peak RSS MiB':>14}{'wall s':>9}")
    for r in rows:
        print(f"{r['case']:<48}{r['peak_rss_MiB']:>14.0f}{r['wall_s']:>9.1f}")
    payload = {"measured_at": time.strftime("%Y-%m-%d %H:%M"), "rows": rows}
    write_record(PERF / "memory.json", payload, command, indent=2)


if __name__ == "__main__":
    main()
