"""The device check's step phases (bench/device/check.py): the real `PPOLoop.step` through `dtppo ppo` in a
subprocess, its per-phase timings, FLOP rates against a matmul peak measured in the same run, and profiled updates;
at the 0.5B shape with the project's tokenizer (``step``), with Qwen's vocabulary at the 0.5B and 1.5B shapes (the
throughput table) and with the vllm backend (``step_vllm``)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common.paths import REPO
from bench.common.shapes import QWEN25_VOCAB, write_model_dir
from bench.common.workload import train_flops
from bench.device.numerics import sync
from bench.device.phases import DEADLINE
from dtppo.config import TinyModelConfig
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.observability.logger import read_metrics
from dtppo.observability.profiling import PROFILE_ENV, PROFILE_FROM_ENV

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
    argv = [sys.executable, "-m", "dtppo", "ppo", str(REPO / "recipes" / "tiny-math-cpu.yaml"), *overrides]
    start = time.perf_counter()
    proc = subprocess.run(
        [*argv, f"logger.log_dir={log_dir}"], env=env, capture_output=True, text=True, timeout=DEADLINE.timeout(timeout)
    )
    return proc, read_metrics(log_dir, missing_ok=True), time.perf_counter() - start


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
    """The real `PPOLoop.step` (through `dtppo ppo` and its workers) on a Qwen2.5-0.5B-shaped random model
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
    # no critic warmup, one epoch, one critic update: one update per model per step (the profiled call)
    fixed = """ppo.init_from_sft=false value.warmup.steps=0 ppo.ppo_epochs=1 value.updates_per_step=1
        ppo.validation.at_start=false ppo.validation.max_samples=8 ppo.validation.batch_size=8 reward.num_workers=0
        checkpointing.enabled=false logger.tensorboard=false logger.progress=false""".split()
    sizes = {"ppo.max_num_steps": steps, "ppo.validation.period": steps, "ppo.num_prompts_per_step": args.batch}
    sizes |= {"policy.generation.max_new_tokens": args.new_tokens, "policy.logprob_batch_size": args.batch}
    sizes |= {"value.inference_batch_size": args.batch}
    for role in ("policy", "value"):
        sizes |= {f"{role}.train_global_batch_size": args.batch, f"{role}.train_micro_batch_size": args.micro}
    model = [f"policy.model.path={model_dir}"] if model_dir else shape_overrides(shape)  # the critic starts from it
    return [*fixed, *(f"{key}={value}" for key, value in sizes.items()), *model]


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
        # the goal: <= 1.15 at equal shapes (the first H200 run measured 3.9)
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
    """The step at Qwen2.5-``name``'s shape with the 151,936-entry vocabulary (a model directory
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
