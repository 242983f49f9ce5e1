"""The README's one-GPU quickstart as a device check (phase ``quickstart``): recipes/qwen2.5-0.5b-gsm8k-1gpu.yaml for 2
PPO steps, offline, on random weights of Qwen2.5-0.5B's shape (the CPU fallback: the smoke shape, small batches) and
the GSM8K rows the tests ship, then `dtppo export` of its checkpoint: the exit codes, the first lines the run prints,
where the checkpoint and the export land, the step time and the peak device memory. Plumbing and memory, not learning.
Run alone, it keeps the result as bench/results/device/quickstart_<mode>.json and writes the README's quickstart
block from it (tests/repo/test_readme.py renders the block again).

    python -m bench.device.quickstart           # on a GPU; --cpu: the CPU fallback
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common.paths import DEVICE, REPO
from bench.common.readme import with_block
from bench.common.record import write_record
from bench.common.shapes import QWEN25_VOCAB, write_model_dir
from bench.device.phases import DEADLINE
from dtppo.observability.logger import read_metrics

README = REPO / "README.md"
BLOCK = "quickstart-output"  # the README block this script writes (bench.common.readme)
RECIPE = REPO / "recipes" / "qwen2.5-0.5b-gsm8k-1gpu.yaml"
GSM8K = REPO / "tests" / "data" / "gsm8k"
SMOKE_VOCAB = 512  # the CPU fallback's vocabulary, as the throughput table's smoke row
# The CPU fallback keeps the plumbing and shrinks the work: a 2-block model, 8 prompts, 16 new tokens.
CPU_SIZES = """ppo.num_prompts_per_step=8 ppo.validation.max_samples=8 ppo.validation.batch_size=8
    policy.generation.max_new_tokens=16 policy.train_global_batch_size=8 value.train_global_batch_size=8
    reward.num_workers=0""".split()


def _dtppo(args: list[str], cwd: Path, cuda: bool) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **({} if cuda else {"CUDA_VISIBLE_DEVICES": ""}))
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "dtppo", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE.timeout(1500),
    )
    return proc, time.perf_counter() - start


def quickstart(cuda: bool) -> dict:
    """The quickstart recipe for 2 steps and the export of its last checkpoint; ``passed`` when both exit 0, the
    checkpoint and both exported models are where the README says, and every step's record is there."""
    device = torch.device("cuda" if cuda else "cpu")
    shape = "0.5b" if cuda else "smoke"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_model_dir(work / "model", shape, QWEN25_VOCAB if cuda else SMOKE_VOCAB, device)
        local = [f"{role}.model.path={work / 'model'}" for role in ("policy", "value")] + [
            f"data.{split}.{key}"
            for split, name in (("train", "train"), ("validation", "test"))
            for key in (f"path={GSM8K / f'{name}.jsonl'}", "hf_config=null", "split=null")
        ]
        # the recipe's training sizes; one short validation (the device session's minutes are few)
        short = [
            "ppo.max_num_steps=2",
            "ppo.validation.period=2",
            "ppo.validation.at_start=false",
            "ppo.validation.max_samples=64",
        ]
        overrides = [*local, *short, *([] if cuda else CPU_SIZES)]
        run, run_s = _dtppo(["ppo", str(RECIPE), *overrides], work, cuda)
        ckpt = work / "runs" / "qwen2.5-0.5b-gsm8k" / "checkpoints"
        export, _ = _dtppo(["export", str(ckpt / "step_2"), "exported"], work, cuda)
        exported = sorted(p.name for p in (work / "exported").iterdir()) if (work / "exported").is_dir() else []
        records = read_metrics(work / "runs" / "qwen2.5-0.5b-gsm8k", missing_ok=True)
        checkpoints = sorted(p.name for p in ckpt.iterdir()) if ckpt.is_dir() else []
    steps = [r for r in records if "train/reward" in r]
    return {
        "recipe": str(RECIPE.relative_to(REPO)),
        "shape": shape,
        "overrides": [o.replace(tmp, "TMP") for o in overrides],
        "exit_codes": [run.returncode, export.returncode],
        "seconds": run_s,
        "first_lines": run.stdout.splitlines()[:12],
        "checkpoints": checkpoints,
        "exported": exported,
        "step_seconds": [r.get("timing/step") for r in steps],
        "max_memory_allocated_gib": max(
            (r["perf/max_memory_allocated_gib"] for r in steps if "perf/max_memory_allocated_gib" in r), default=None
        ),
        "validation_accuracy": [r.get("validation/accuracy") for r in records if "validation/accuracy" in r],
        "stderr_tail": (run.stderr + export.stderr)[-3000:] if run.returncode or export.returncode else "",
        "passed": run.returncode == 0
        and export.returncode == 0
        and "step_2" in checkpoints
        and {"critic", "policy"} <= set(exported)
        and [r["step"] for r in steps] == [1, 2],
    }


def render(result: dict) -> str:
    """The README block: where the run was made, then the first lines it printed."""
    where = (
        f"on {result['device']}, random weights of Qwen2.5-0.5B's shape"
        if result["mode"] == "cuda"
        else "on CPU at the smoke shape (2 blocks, random weights) with 8 prompts and 16 new tokens per step"
    )
    return (
        f"First lines of a 2-step run of this recipe {where} ({result['date']}):\n\n```\n"
        + "\n".join(result["first_lines"])
        + "\n```"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="the CPU fallback even where CUDA is available")
    args = parser.parse_args()
    cuda = torch.cuda.is_available() and not args.cpu
    from datetime import date

    result = quickstart(cuda) | {
        "mode": "cuda" if cuda else "cpu",
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "date": date.today().isoformat(),
    }
    kept = DEVICE / f"quickstart_{result['mode']}.json"
    result = write_record(kept, result)  # the README shows what the record holds, paths as written there
    if not result["passed"]:
        raise SystemExit(f"the quickstart run failed:\n{result['stderr_tail']}")
    README.write_text(with_block(README.read_text(), BLOCK, render(result)))
    print(f"wrote {kept.relative_to(REPO)} and README.md's quickstart block")


if __name__ == "__main__":
    main()
