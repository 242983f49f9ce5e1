"""The GPU check behind bench/device/gpu.sh: phases under one deadline (bench/device/phases.py), the JSON rewritten
after each, the first phases answering the most. ``--phases`` picks and orders them; ``--deadline`` skips what
would start past it. In the default order:

- environment: versions; math-verify (every `dtppo ppo` imports it) and PEFT importable.
- features_smoke: the tiny recipe for 2 PPO steps with activation checkpointing, CPU offload, the reference (KL)
  and LoRA adapters (rank 16, where PEFT is installed) on the device.
- step: the real `PPOTrainer.step` (`dtppo ppo` in a subprocess) on a Qwen2.5-0.5B-shaped random model, one
  warm-up, N measured steps and one more whose two updates are profiled (the critic/policy gap, operator by
  operator). On CUDA even one process runs its models under FSDP2 (a one-rank group) with bf16 parameters and fp32
  reduction, the same policy as a multi-rank run.
- decode: dtppo's sampler eager and with ``decode_graph`` (bench/device/decode.py), 256 prompts x 256 new tokens
  at the 0.5B shape, with whether inductor captured CUDA graphs.
- table_1.5b, table_0.5b: the step at Qwen2.5-1.5B's and -0.5B's shapes with the real 151,936-entry vocabulary:
  phase shares, tokens/s, each update's FLOP rate, peak memory.
- quickstart: the README's one-GPU recipe for 2 steps, its checkpoint and export (bench/device/quickstart.py).
- long_responses: the critic's and the policy's training pass and the log-prob recompute at the 0.5B shape on 2
  rows of 8k and of 16k tokens, padded, cp = 1, bf16, through dtppo's attention seam (bench/perf/long_responses.py).
- hf_generate: ``transformers.generate`` with a static cache on the decode phase's model and prompts.
- checkpoint_resume: the tiny recipe for 2 steps with checkpoints, then resumed to 3 (DCP on the device's group).
- numerics: the tiny recipe's models on the device against CPU fp32 (bench/device/numerics.py).
- memory_features, memory_lora: `bench/perf/memory.py features` / `lora` rows at the real depth.
- step_vllm: the step with `policy.generation.backend=vllm`, where vLLM is installed.

Without CUDA (or with --cpu) the same code runs as a smoke test at tiny sizes in fp32, in seconds per phase; its
JSON goes to runs/ (never under the GPU result's name).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

from bench.common.paths import DEVICE, REPO
from bench.common.record import command_line, provenance
from bench.common.shapes import QWEN25_VOCAB, SHAPES, write_model_dir
from bench.common.workload import train_flops
from bench.device.decode import decode_speed, hf_generate_speed
from bench.device.numerics import numerics, sync
from bench.device.phases import DEADLINE, run_phases
from bench.device.quickstart import quickstart
from bench.device.report import print_phase
from bench.perf.long_responses import measure as long_response_pass
from bench.perf.memory import features_rows, lora_rows
from dtppo.config import TinyModelConfig
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.observability.logger import read_metrics
from dtppo.observability.profiling import PROFILE_ENV, PROFILE_FROM_ENV

COMMAND = os.environ.get("DTPPO_GPU_COMMAND", "python -m bench.device.check")
# Qwen2.5-0.5B's transformer shape (its 151k vocabulary replaced by the project's character tokenizer).
QWEN25_05B = TinyModelConfig(
    hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864, max_position_embeddings=4096
)
CPU_SMOKE = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int, iters: int) -> float:
    """Dense matmul FLOP/s measured here and now: the ceiling the step's fraction is taken against."""
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    sync(device)
    return 2 * n**3 * iters / (time.perf_counter() - start)


def shape_overrides(shape: dict) -> list[str]:
    """The same random-init shape (``TinyModelConfig``'s fields) for policy and critic, as `dtppo ppo` overrides."""
    return [f"{role}.model.tiny.{key}={value}" for role in ("policy", "value") for key, value in shape.items()]


def run_dtppo(
    overrides: list[str], log_dir: Path, cuda: bool, timeout: float, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, list[dict], float]:
    """`python -m dtppo ppo` on the tiny recipe with ``overrides`` in a subprocess (CUDA hidden unless ``cuda``):
    the process, its metrics.jsonl records and its wall seconds."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **({} if cuda else {"CUDA_VISIBLE_DEVICES": ""}), **(extra_env or {}))
    start = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dtppo",
            "ppo",
            str(REPO / "recipes" / "tiny-math-cpu.yaml"),
            *overrides,
            f"logger.log_dir={log_dir}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE.timeout(timeout),
    )
    seconds = time.perf_counter() - start
    records = read_metrics(log_dir, missing_ok=True)
    return proc, records, seconds


def step_flops(batch: int, mean_tokens: float, shape: dict, vocab: int) -> float:
    """Model FLOPs of one PPO step, estimated from the mean sequence length (bench/common/workload.py's formula):
    generation ≈ one policy forward, value and log-prob forwards, then forward + backward of critic and policy."""
    lengths = torch.full((batch,), mean_tokens)
    policy = train_flops(shape, vocab, lengths) / 3  # one forward
    critic = train_flops(shape, 1, lengths) / 3
    return 2 * policy + critic + 3 * (policy + critic)


def trainer_steps(
    cuda: bool,
    args,
    backend_overrides: tuple[str, ...] = (),
    profile: bool = False,
    model_dir: Path | None = None,
    model_shape: dict | None = None,
    vocab: int | None = None,
) -> dict:
    """The real `PPOTrainer.step` (through `dtppo ppo` and its workers) on a Qwen2.5-0.5B-shaped random model
    (CUDA) or a 64-hidden one (CPU fallback), or on ``model_dir`` (of ``model_shape`` and ``vocab``): one warm-up
    step, then ``args.steps`` measured ones. Per-phase seconds are the trainer's own `timing/*` metrics (medians
    over the measured steps). ``profile``: one more step whose two updates run under torch.profiler
    (``update_profiles``); it is left out of the timings, which the profiler would slow."""
    shape = model_shape or vars(QWEN25_05B if cuda else CPU_SMOKE)
    steps = 1 + args.steps + int(profile)
    overrides = _step_overrides(args, steps, model_dir, shape) + [*backend_overrides, *args.override]
    with tempfile.TemporaryDirectory() as tmp:
        # Each model trains once per step (_step_overrides), so the last step's updates are call `steps` of each.
        env = {PROFILE_ENV: f"{tmp}/profile", PROFILE_FROM_ENV: str(steps)} if profile else None
        proc, records, seconds = run_dtppo(overrides, Path(tmp) / "log", cuda, timeout=900, extra_env=env)
        profiles = update_profiles(Path(tmp) / "profile", cuda) if profile else {}
    measured = [r for r in records if "timing/step" in r][1 : 1 + args.steps]
    result = {
        "model_shape": shape,
        "vocab_size": vocab or len(build_char_tokenizer()),
        "precision": "bf16 params, fp32 reduce (FSDP2)" if cuda else "fp32",
        "batch": args.batch,
        "max_new_tokens": args.new_tokens,
        "micro_batch": args.micro,
        "overrides": overrides,
        "exit_code": proc.returncode,
        "wall_s": seconds,
        "steps_measured": len(measured),
        "stderr_tail": proc.stderr[-3000:] if proc.returncode else "",
    } | profiles
    if proc.returncode or not measured:
        return result | {"passed": False}
    last = measured[-1]
    keys = ("train/reward", "train/loss", "train/critic/loss", "train/token_mult_prob_error")
    return (
        result
        | _step_figures(measured, shape, result["vocab_size"], args.batch, cuda)
        | {
            "last_step": {k: last.get(k) for k in (*keys, "train/critic/explained_var")},
            "passed": all(isinstance(last.get(k), float) and math.isfinite(last[k]) for k in keys)
            and (not profile or profiles["critic_over_policy_self_time"] is not None),
        }
    )


def _step_overrides(args, steps: int, model_dir: Path | None, shape: dict) -> list[str]:
    batch_keys = [
        f"{role}.{key}={n}"
        for role in ("policy", "value")
        for key, n in (("train_global_batch_size", args.batch), ("train_micro_batch_size", args.micro))
    ]
    model = [f"policy.model.path={model_dir}"] if model_dir else shape_overrides(shape)  # the critic starts from it
    return [
        "ppo.init_from_sft=false",
        f"ppo.max_num_steps={steps}",
        "ppo.policy_training_start_step=0",  # with the next two: one update per model per step (the profile's call)
        "ppo.ppo_epochs=1",
        "value.updates_per_step=1",
        f"ppo.num_prompts_per_step={args.batch}",
        f"policy.generation.max_new_tokens={args.new_tokens}",
        "ppo.val_at_start=false",
        f"ppo.val_period={steps}",
        "ppo.max_val_samples=8",
        "ppo.val_batch_size=8",
        *batch_keys,
        f"policy.logprob_batch_size={args.batch}",
        f"value.inference_batch_size={args.batch}",
        "checkpointing.enabled=false",
        "reward.num_workers=0",
        "logger.tensorboard=false",
        "logger.progress=false",
        *model,
    ]


def update_profiles(directory: Path, cuda: bool) -> dict:
    """The profiled updates (dtppo.observability.profiling), one per model: the total self time on the device (CPU
    in the fallback) and the top operators, so the critic/policy gap has a kernel-level account."""
    by_model = {}
    for file in sorted(directory.glob("*_rank0_call*.json")):
        summary = json.loads(file.read_text())
        by_model[summary["model"]] = {k: v for k, v in summary.items() if k != "top"} | {"top": summary["top"][:12]}
    key = "total_self_device_ms" if cuda else "total_self_cpu_ms"
    policy, value = by_model.get("policy"), by_model.get("value")
    ratio = value[key] / policy[key] if policy and value and policy[key] else None
    return {"update_profiles": by_model, "critic_over_policy_self_time": ratio}


def _step_figures(measured: list[dict], shape: dict, vocab: int, batch: int, cuda: bool) -> dict:
    """Medians of the measured steps' timings, throughputs, and model FLOP rates against the matmul peak measured
    here. An update's FLOPs are forward + backward of the body over all tokens, plus the head: the policy's over
    the response tokens only (its log-probs are chunked over those), the critic's scalar head over all."""
    phases = [k for k in measured[0] if k.startswith("timing/") and all(k in r for r in measured)]
    median = {k: statistics.median(r[k] for r in measured) for k in phases}
    tokens = statistics.median(r["perf/tokens_per_sec"] * r["timing/step"] for r in measured)
    generated = statistics.median(r["train/mean_gen_tokens_per_sample"] for r in measured) * batch
    flops = step_flops(batch, tokens / batch, shape, vocab)
    lengths = torch.full((batch,), tokens / batch)
    update_flops = {
        "policy_update": train_flops(shape, 0, lengths) + 6.0 * shape["hidden_size"] * vocab * generated,
        "critic_update": train_flops(shape, 1, lengths),
    }
    peak = matmul_peak(
        torch.device("cuda" if cuda else "cpu"),
        torch.bfloat16 if cuda else torch.float32,
        8192 if cuda else 1024,
        20 if cuda else 5,
    )
    memory = [r["perf/max_memory_allocated_gib"] for r in measured if "perf/max_memory_allocated_gib" in r]
    return {
        "timing_s_median": median,
        "step_s_all": [r["timing/step"] for r in measured],
        "phase_share": {
            k.removeprefix("timing/"): v / median["timing/step"]
            for k, v in median.items()
            if k not in ("timing/step", "timing/validation")
        },
        # Issue 23's goal: <= 1.15 at equal shapes (the first H200 run measured 3.9).
        "critic_over_policy_update": median.get("timing/critic_update", math.nan)
        / median.get("timing/policy_update", math.nan),
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / median["timing/step"],
        "generated_tokens_per_step": generated,
        "generated_tokens_per_s": generated / median["timing/generation"],
        "training_tokens_per_s": {k: tokens / median[f"timing/{k}"] for k in update_flops if f"timing/{k}" in median},
        "model_flops_per_step_estimate": flops,
        "achieved_tflops": flops / median["timing/step"] / 1e12,
        "peak_matmul_dtype": "bfloat16" if cuda else "float32",
        "peak_tflops": peak / 1e12,
        "peak_fraction": flops / median["timing/step"] / peak,
        "update_peak_fraction": {
            k: f / median[f"timing/{k}"] / peak for k, f in update_flops.items() if f"timing/{k}" in median
        },
        "max_memory_allocated_gib": max(memory) if memory else None,
    }


def throughput_row(cuda: bool, args, name: str) -> dict:
    """Issue 23, item 3: the step at Qwen2.5-``name``'s shape with the 151,936-entry vocabulary (a model directory
    written by bench/common/shapes.py, random bf16 weights), one process. Goals: each update >= 25 % of the bf16
    peak at 0.5B and >= 35 % at 1.5B. CPU fallback: the smoke shape with a 512-entry vocabulary (0.5B's phase; the
    1.5B phase is skipped)."""
    if not cuda and name != "0.5b":
        return {"skipped": "CPU fallback"}
    device = torch.device("cuda" if cuda else "cpu")
    vocab, shape_name = (QWEN25_VOCAB, name) if cuda else (512, "smoke")
    with tempfile.TemporaryDirectory() as tmp:
        shape = write_model_dir(Path(tmp) / "model", shape_name, vocab, device)
        run = trainer_steps(cuda, args, model_dir=Path(tmp) / "model", model_shape=shape, vocab=vocab)
    if cuda:
        torch.cuda.empty_cache()  # the model was built here, in the parent
    return {"shape": shape_name, "update_peak_fraction_goal": {"0.5b": 0.25, "1.5b": 0.35}.get(shape_name)} | run


def vllm_steps(cuda: bool, args) -> dict:
    """The same steps with `policy.generation.backend=vllm`, where a CUDA machine has vLLM installed. The CPU
    fallback skips it: the CPU engine is covered by tests/functional/test_vllm.py, and its attention has no
    kernel for the smoke model's head size (16)."""
    if not cuda:
        return {"skipped": "CPU fallback"}
    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vllm is not importable on this machine"}
    result = trainer_steps(cuda, args, ("policy.generation.backend=vllm", "policy.generation.vllm_kv_cache_mib=8192"))
    error = result.get("last_step", {}).get("train/token_mult_prob_error")
    # The reference's gate on sampler-vs-trainer agreement (the engine and the trainer are different programs).
    return result | {"passed": result["passed"] and error is not None and error < 1.05}


def checkpoint_resume(cuda: bool) -> dict:
    """The tiny recipe for 2 PPO steps with a checkpoint at each, then the same command to 3 steps: it must
    resume from step 2 (DCP save and load on the device's process group) and log only step 3."""
    fast = [
        "ppo.init_from_sft=false",
        "ppo.num_prompts_per_step=16",
        "ppo.max_val_samples=32",
        "ppo.val_batch_size=32",
        "policy.train_global_batch_size=8",
        "policy.train_micro_batch_size=4",
        "value.train_global_batch_size=8",
        "value.train_micro_batch_size=4",
        "reward.num_workers=0",
        "logger.progress=false",
        "logger.tensorboard=false",
        "checkpointing.save_period=1",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        fast.append(f"checkpointing.checkpoint_dir={tmp}/ckpt")
        log = Path(tmp) / "log"
        first, records, first_s = run_dtppo([*fast, "ppo.max_num_steps=2"], log, cuda, timeout=900)
        second, records, second_s = run_dtppo([*fast, "ppo.max_num_steps=3"], log, cuda, timeout=900)
    steps = [r["step"] for r in records if "train/loss" in r]
    last = next((r for r in reversed(records) if "train/loss" in r), {})
    keys = ("train/reward", "train/loss", "train/critic/loss", "train/token_mult_prob_error")
    metrics = {k: last.get(k) for k in keys}
    resumed = "resumed from" in second.stdout
    return {
        "exit_codes": [first.returncode, second.returncode],
        "seconds": [first_s, second_s],
        "steps_logged": steps,
        "resumed": resumed,
        "last_step_metrics": metrics,
        "stderr_tail": (first.stderr + second.stderr)[-3000:] if first.returncode or second.returncode else "",
        "passed": first.returncode == 0
        and second.returncode == 0
        and resumed
        and steps == [1, 2, 3]
        and all(isinstance(v, float) and math.isfinite(v) for v in metrics.values()),
    }


FEATURE_FLAGS = [f"{w}.{k}=true" for w in ("policy", "value") for k in ("activation_checkpointing", "cpu_offload")]


def memory_features(cuda: bool) -> dict:
    """On CUDA: the features' rows at the real depth (24 blocks, one process); offload must lower the memory
    resident on the device between steps, activation checkpointing what the forward leaves held for backward.
    CPU fallback: skipped (the CPU table is `python -m bench.perf.memory features`, and offload saves nothing where the
    device is host memory)."""
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
    """On CUDA: `bench/perf/memory.py lora` rows at the real depth, one process: device memory of policy + reference +
    critic and AdamW's state, full fine-tuning vs LoRA rank 16 / 64; LoRA must hold less. Skipped on the CPU
    fallback (the CPU table is `python -m bench.perf.memory lora`) and where PEFT is not installed."""
    if not cuda:
        return {"skipped": "CPU fallback"}
    if importlib.util.find_spec("peft") is None:
        return {"skipped": "peft is not installed (carry its wheel and accelerate's, docs/lora.md)"}
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
    overrides = [
        "ppo.init_from_sft=false",
        "ppo.max_num_steps=2",
        "ppo.num_prompts_per_step=16",
        "ppo.max_val_samples=16",
        "ppo.val_batch_size=16",
        "policy.train_global_batch_size=8",
        "value.train_global_batch_size=8",
        "loss.kl_coef=0.05",
        "reward.num_workers=0",
        "logger.progress=false",
        "logger.tensorboard=false",
        "checkpointing.enabled=false",
        *FEATURE_FLAGS,
        *lora,
    ]
    with tempfile.TemporaryDirectory() as tmp:
        proc, records, seconds = run_dtppo(overrides, Path(tmp) / "log", cuda, timeout=900)
    last = next((r for r in reversed(records) if "train/loss" in r), {})
    keys = ("train/reward", "train/loss", "train/critic/loss", "train/token_mult_prob_error")
    return {
        "overrides": overrides,
        "exit_code": proc.returncode,
        "seconds": seconds,
        "last_step_metrics": {k: last.get(k) for k in keys},
        "stderr_tail": proc.stderr[-3000:] if proc.returncode else "",
        "passed": proc.returncode == 0 and all(isinstance(last.get(k), float) and math.isfinite(last[k]) for k in keys),
    }


def long_responses(cuda: bool) -> dict:
    """The long_responses phase (module docstring); the CPU fallback runs the tiny shape at 256 tokens. A pass that
    runs out of device memory is recorded as such (and fails the phase)."""
    shape = {**SHAPES["0.5b"], "vocab_size": QWEN25_VOCAB} if cuda else None
    rows = []
    for length in (8192, 16384) if cuda else (256,):
        for what in ("critic", "policy", "logprobs"):
            row = {"T": length, "what": what, "layout": "padded", "cp": 1}
            try:
                row |= long_response_pass(length, "padded", what, shape=shape, device="cuda" if cuda else "cpu")
            except torch.OutOfMemoryError:
                row["failed"] = "out of device memory"
            if cuda:
                torch.cuda.empty_cache()
            rows.append(row)
    return {"rows": rows, "passed": all("seconds" in row for row in rows)}


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


PHASES = [
    "environment",
    "features_smoke",
    "step",
    "decode",
    "table_1.5b",
    "table_0.5b",
    "quickstart",
    "long_responses",
    "hf_generate",
    "checkpoint_resume",
    "numerics",
    "memory_features",
    "memory_lora",
    "step_vllm",
]


def phase_runs(cuda: bool, args, record: dict) -> dict[str, Callable[[], dict]]:
    """Each phase by name; the first ones answer the most (docs/performance.md, "The device script")."""
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
