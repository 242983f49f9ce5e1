"""The GPU check behind bench/device/gpu.sh: phases under one deadline (bench/device/phases.py), the JSON rewritten
after each, the first phases answering the most. ``--phases`` picks and orders them; ``--deadline`` skips what
would start past it. In the default order:

- environment: versions; math-verify (every `dtppo ppo` imports it) and PEFT importable.
- features_smoke: the tiny recipe for 2 PPO steps with activation checkpointing, CPU offload, the reference (KL)
  and LoRA adapters (rank 16, where PEFT is installed) on the device.
- step, table_1.5b, table_0.5b, step_vllm: the real `PPOLoop.step` (bench/device/step.py) at the 0.5B shape with
  two updates profiled; at the 1.5B and 0.5B shapes with Qwen's vocabulary; with the vllm backend, where installed.
- decode, hf_generate: dtppo's sampler eager and with ``decode_graph``, and ``transformers.generate``
  (bench/device/decode.py).
- quickstart: the README's one-GPU recipe for 2 steps, its checkpoint and export (bench/device/quickstart.py).
- long_responses: the training passes and the log-prob recompute on 8k and 16k tokens (bench/device/long_responses.py).
- checkpoint_resume: the tiny recipe for 2 steps with checkpoints, then resumed to 3 (DCP on the device's group).
- numerics: the tiny recipe's models on the device against CPU fp32 (bench/device/numerics.py).
- memory_features, memory_lora: bench/perf/memory_features.py's and memory_lora.py's rows at the real depth.

On CUDA even one process runs its models under FSDP2 (a one-rank group) with bf16 parameters and fp32 reduction, as
a multi-rank run does. Without CUDA (or with --cpu) the same code runs as a smoke test at tiny sizes in fp32, in
seconds per phase; its JSON goes to runs/ (never under the GPU result's name).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

from bench.common.paths import DEVICE, REPO
from bench.common.record import command_line, provenance
from bench.device.decode import decode_speed, hf_generate_speed
from bench.device.long_responses import long_responses
from bench.device.numerics import numerics
from bench.device.phases import DEADLINE, run_phases
from bench.device.quickstart import quickstart
from bench.device.report import print_phase
from bench.device.step import run_dtppo, throughput_row, trainer_steps, vllm_steps
from bench.perf.memory_features import features_rows
from bench.perf.memory_lora import lora_rows

COMMAND = os.environ.get("DTPPO_GPU_COMMAND", "python -m bench.device.check")


def checkpoint_resume(cuda: bool) -> dict:
    """The tiny recipe for 2 PPO steps with a checkpoint at each, then the same command to 3 steps: it must
    resume from step 2 (DCP save and load on the device's process group) and log only step 3."""
    fast = """ppo.init_from_sft=false ppo.num_prompts_per_step=16 ppo.validation.max_samples=32
        ppo.validation.batch_size=32 policy.train_global_batch_size=8 policy.train_micro_batch_size=4
        value.train_global_batch_size=8 value.train_micro_batch_size=4 reward.num_workers=0 logger.progress=false
        logger.tensorboard=false checkpointing.save_period=1""".split()
    with tempfile.TemporaryDirectory() as tmp:
        fast.append(f"checkpointing.checkpoint_dir={tmp}/ckpt")
        log = Path(tmp) / "log"
        first, records, first_s = run_dtppo([*fast, "ppo.max_num_steps=2"], log, cuda, timeout=900)
        second, records, second_s = run_dtppo([*fast, "ppo.max_num_steps=3"], log, cuda, timeout=900)
    steps = [r["step"] for r in records if "train/loss" in r]
    metrics, finite = last_step(records)
    resumed, failed = "resumed from" in second.stdout, first.returncode or second.returncode
    return {
        "exit_codes": [first.returncode, second.returncode],
        "seconds": [first_s, second_s],
        "steps_logged": steps,
        "resumed": resumed,
        "last_step_metrics": metrics,
        "stderr_tail": (first.stderr + second.stderr)[-3000:] if failed else "",
        "passed": not failed and resumed and steps == [1, 2, 3] and finite,
    }


def last_step(records: list[dict]) -> tuple[dict, bool]:
    """The last trained step's reward, losses and mismatch, and whether all of them are finite numbers."""
    last = next((r for r in reversed(records) if "train/loss" in r), {})
    metrics = {
        k: last.get(k) for k in ("train/reward", "train/loss", "train/critic/loss", "train/token_mult_prob_error")
    }
    return metrics, all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())


FEATURE_FLAGS = [f"{w}.{k}=true" for w in ("policy", "value") for k in ("activation_checkpointing", "cpu_offload")]


def memory_features(cuda: bool) -> dict:
    """On CUDA: the features' rows at the real depth (24 blocks, one process); offload must lower the memory
    resident on the device between steps, activation checkpointing what the forward leaves held for backward.
    CPU fallback: skipped (the CPU table is `python -m bench.perf.memory_features`, and offload saves nothing where
    the device is host memory)."""
    if not cuda:
        return {"skipped": "CPU fallback"}
    rows = features_rows(24, (1,), COMMAND, lambda: DEADLINE.timeout(600))
    by = {(r["role"], r["feature"]): r for r in rows}
    passed = all(
        by[(role, "cpu_offload")]["device_resident_MiB"] < by[(role, "off")]["device_resident_MiB"]
        and by[(role, "activation_checkpointing")]["device_held_after_forward_MiB"]
        < by[(role, "off")]["device_held_after_forward_MiB"]
        for role in ("policy", "critic")
    )
    return {"rows": rows, "passed": passed}


def memory_lora(cuda: bool) -> dict:
    """On CUDA: bench/perf/memory_lora.py's rows at the real depth, one process: device memory of policy +
    reference + critic and AdamW's state, full fine-tuning vs LoRA rank 16 / 64; LoRA must hold less. Skipped on the
    CPU fallback (the CPU table is `python -m bench.perf.memory_lora`) and where PEFT is not installed."""
    if not cuda:
        return {"skipped": "CPU fallback"}
    if importlib.util.find_spec("peft") is None:
        return {"skipped": "peft is not installed (carry its wheel and accelerate's, docs/guides/lora.md)"}
    rows = lora_rows(24, (1,), COMMAND, lambda: DEADLINE.timeout(600))
    by = {r["mode"]: r for r in rows}
    passed = all(by[m]["device_resident_MiB"] < by["full"]["device_resident_MiB"] for m in ("lora-r16", "lora-r64"))
    return {"rows": rows, "passed": passed}


def features_smoke(cuda: bool) -> dict:
    """The tiny recipe for 2 PPO steps with activation checkpointing and CPU offload on for policy (and its
    reference: KL on) and critic, and the policy's LoRA adapters (rank 16) where PEFT is installed: the workers
    build, train, refit (the merged adapters, from offloaded shards) and validate with all of them. CPU fallback:
    skipped (tests/distributed/test_memory_features.py builds the workers with both flags on 2 gloo ranks)."""
    if not cuda:
        return {"skipped": "CPU fallback"}
    lora = ["policy.lora.rank=16"] if importlib.util.find_spec("peft") else []
    overrides = (
        """ppo.init_from_sft=false ppo.max_num_steps=2 ppo.num_prompts_per_step=16
        ppo.validation.max_samples=16 ppo.validation.batch_size=16 policy.train_global_batch_size=8
        value.train_global_batch_size=8 loss.kl.coef=0.05 reward.num_workers=0 logger.progress=false
        logger.tensorboard=false checkpointing.enabled=false""".split()
        + [*FEATURE_FLAGS, *lora]
    )
    with tempfile.TemporaryDirectory() as tmp:
        proc, records, seconds = run_dtppo(overrides, Path(tmp) / "log", cuda, timeout=900)
    metrics, finite = last_step(records)
    return {
        "overrides": overrides,
        "exit_code": proc.returncode,
        "seconds": seconds,
        "last_step_metrics": metrics,
        "stderr_tail": proc.stderr[-3000:] if proc.returncode else "",
        "passed": proc.returncode == 0 and finite,
    }


def environment(cuda: bool) -> dict:
    """What the later phases need: versions, and whether math-verify (imported by every `dtppo ppo`) and PEFT
    import here."""
    found = {}
    for module in ("math_verify", "peft"):
        try:
            found[module] = getattr(importlib.import_module(module), "__version__", "importable")
        except ImportError as error:
            found[module] = f"missing: {error}"
    return {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        **found,
        "passed": not found["math_verify"].startswith("missing"),
    }


PHASES = """environment features_smoke step decode table_1.5b table_0.5b quickstart long_responses hf_generate
    checkpoint_resume numerics memory_features memory_lora step_vllm""".split()


def phase_runs(cuda: bool, args, record: dict) -> dict[str, Callable[[], dict]]:
    """Each phase by name; the first ones answer the most (docs/guides/performance-gpu.md, "`bash
    bench/device/gpu.sh`: the checks")."""
    device = torch.device("cuda" if cuda else "cpu")

    def graph_tokens_per_s() -> float | None:
        row = record["phases"].get("decode", {}).get("variants", {}).get("dtppo decode_graph")
        return row["tokens_per_s"] if row else None

    def checks() -> dict:
        rows = numerics(device, batch=16 if cuda else 4, new_tokens=24 if cuda else 8)
        return {"checks": rows, "passed": all(c["passed"] for c in rows)}

    return {
        "environment": lambda: environment(cuda),
        "features_smoke": lambda: features_smoke(cuda),
        "step": lambda: trainer_steps(cuda, args, profile=True),
        "decode": lambda: decode_speed(cuda, args.decode_prompts, args.decode_tokens, args.decode_full_on_cpu),
        "table_1.5b": lambda: throughput_row(cuda, args, "1.5b"),
        "table_0.5b": lambda: throughput_row(cuda, args, "0.5b"),
        "quickstart": lambda: quickstart(cuda),
        "long_responses": lambda: long_responses(cuda),
        "hf_generate": lambda: (
            hf_generate_speed(cuda, args.decode_prompts, args.decode_tokens, graph_tokens_per_s())
            if cuda or args.decode_full_on_cpu
            else {"skipped": "CPU fallback"}
        ),
        "checkpoint_resume": lambda: checkpoint_resume(cuda),
        "numerics": checks,
        "memory_features": lambda: memory_features(cuda),
        "memory_lora": lambda: memory_lora(cuda),
        "step_vllm": lambda: vllm_steps(cuda, args),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true", help="the CPU fallback even where CUDA is available")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated, run in this order")
    parser.add_argument(
        "--deadline", type=float, default=None, help="seconds: later phases are skipped, children end inside it"
    )
    parser.add_argument("--batch", type=int, default=None, help="prompts per step (CUDA 128, CPU 8)")
    parser.add_argument("--new-tokens", type=int, default=None, help="max new tokens per response (CUDA 128, CPU 8)")
    parser.add_argument("--micro", type=int, default=None, help="rows per forward/backward (CUDA 32, CPU the batch)")
    parser.add_argument("--steps", type=int, default=None, help="measured steps after one warm-up (CUDA 2, CPU 1)")
    parser.add_argument("--override", action="append", default=[], help="extra `dtppo ppo` key=value for the step")
    parser.add_argument("--decode-prompts", type=int, default=None, help="decode bench rows (CUDA 256, CPU 4)")
    parser.add_argument("--decode-tokens", type=int, default=None, help="decode bench new tokens (CUDA 256, CPU 8)")
    parser.add_argument(
        "--decode-full-on-cpu", action="store_true", help="CPU fallback: also the compiled decode (minutes)"
    )
    parser.add_argument(
        "--out", default=None, help="JSON path (CUDA: bench/results/device/gpu.json; CPU: runs/gpu-check-cpu.json)"
    )
    args = parser.parse_args(argv)
    args.phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(args.phases) - set(PHASES))
    if unknown:
        parser.error(f"--phases: unknown {', '.join(unknown)} (known: {', '.join(PHASES)})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    DEADLINE.start(args.deadline)
    cuda = torch.cuda.is_available() and not args.cpu
    args.batch = args.batch or (128 if cuda else 8)
    args.new_tokens = args.new_tokens or (128 if cuda else 8)
    args.steps = args.steps or (2 if cuda else 1)
    args.micro = args.micro or (32 if cuda else args.batch)
    args.decode_prompts = args.decode_prompts or (256 if cuda else 4)
    args.decode_tokens = args.decode_tokens or (256 if cuda else 8)
    # A CPU fallback run is a smoke test of the plumbing: it never lands under the GPU result's name.
    out = Path(args.out or (DEVICE / "gpu.json" if cuda else REPO / "runs" / "gpu-check-cpu.json"))
    if not cuda:
        # Tiny matmuls gain nothing from a second thread, and on a loaded machine OpenMP's barrier waits on a
        # descheduled thread make them tens of times slower: the smoke test stays on one thread.
        torch.set_num_threads(1)
    torch.manual_seed(0)
    command = os.environ.get("DTPPO_GPU_COMMAND") or command_line("bench.device.check", argv)
    record = {
        "provenance": provenance(command),
        "mode": "cuda" if cuda else "cpu-fallback",
        "command": command,
        "deadline_s": args.deadline,
        "phases": {},
    }
    runs = phase_runs(cuda, args, record)
    run_phases([(name, runs[name]) for name in args.phases], record, out, print_phase)
    print(f"wrote {out}")
    return 0 if record["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
