"""The GPU check behind bench/device/gpu.sh.

1. Numerics: the tiny recipe's policy and critic on the device against CPU fp32 (log-probs, values, losses,
   gradient norms). This comparison alone has its own small loss code (dtppo's loss functions on plain models).
2. The real `PPOTrainer.step`: `dtppo ppo` in a subprocess on a Qwen2.5-0.5B-shaped random model (CUDA) for one
   warm-up and N measured steps; per-phase seconds are the trainer's own `timing/*` metrics. On CUDA even one
   process runs its models under FSDP2 (a one-rank group) with bf16 parameters and fp32 reduction, the same
   policy as a multi-rank run.
3. The tiny recipe for 2 steps with checkpoints, then resumed to 3 (DCP save/load on the device's group).
4. Activation checkpointing and CPU offload (issue 22, part 2): `bench/perf/memory.py features` rows on the device (one
   training step of the 0.5B-shaped policy and critic, each feature off and on: device memory resident between
   steps, held after the forward, each phase's peak, seconds), and the tiny recipe for 2 steps with both features
   on for both models (the reference model too: KL on).
   LoRA (issue 33): `bench/perf/memory.py lora` rows on the device, policy + reference + critic and AdamW's state at
   full fine-tuning and with adapters of rank 16 / 64 (needs peft on the machine, else recorded as skipped).
5. The updates profiled (issue 23, item 2): the step of 2. again with ``DTPPO_PROFILE_DIR`` set; the critic's and
   the policy's last update, their total device self time and top operators (dtppo.observability.profiling).
   The unprofiled run of 2. gives ``critic_over_policy_update`` from the trainer's timings.
6. The throughput table (issue 23, item 3): the step of 2. at Qwen2.5-0.5B's and -1.5B's shapes with the real
   151,936-entry vocabulary (bench/common/shapes.py): phase shares, tokens/s, each update's FLOP rate, peak memory.
7. Decode (issue 23, item 1; bench/device/decode.py): the torch sampler eager and with ``decode_graph``, next to
   ``transformers.generate`` with a static cache, 256 prompts x 512 new tokens at the 0.5B shape.
8. Long responses (issue 46, item 8; bench/perf/long_responses.py): the critic's and the policy's training pass and
   the log-prob recompute at the 0.5B shape (Qwen's vocabulary) on 2 rows of 8k and of 16k tokens (the second 3/4
   long), padded, cp = 1, bf16, through dtppo's attention (SDPA's causal flash kernel on CUDA): the device's
   peak memory and seconds per pass.

Without CUDA (or with --cpu) the same code runs as a smoke test at tiny sizes in fp32, in seconds; its JSON goes
to runs/ (never under the GPU result's name).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import transformers
from torch import nn

from bench.common.paths import DEVICE, REPO
from bench.common.shapes import QWEN25_VOCAB, SHAPES, write_model_dir
from bench.common.workload import train_flops
from bench.device.decode import decode_speed
from bench.device.quickstart import quickstart
from bench.perf.long_responses import measure as long_response_pass
from bench.perf.memory import features_rows, lora_rows
from dtppo.algorithms.advantages import compute_advantages, token_level_rewards
from dtppo.algorithms.losses import policy_loss, value_loss
from dtppo.config import TinyMathConfig, TinyModelConfig
from dtppo.data.tiny_math import TinyMathStream
from dtppo.generation.generator import TorchGenerator
from dtppo.generation.sampler import stream_key
from dtppo.models.causal_lm import build_causal_lm, tiny_qwen2_config
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.models.value import ValueModel, build_backbone
from dtppo.observability.logger import read_metrics
from dtppo.observability.profiling import PROFILE_ENV
from dtppo.ops import logprobs_from_logits
from dtppo.types import Experience, SampleRequest, SamplingParams

# Qwen2.5-0.5B's transformer shape (its 151k vocabulary replaced by the project's character tokenizer).
QWEN25_05B = TinyModelConfig(
    hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864, max_position_embeddings=4096
)
CPU_SMOKE = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
RECIPE_TINY = TinyModelConfig()  # the tiny recipe's policy and critic (recipes/base.yaml policy.model.tiny)
# Tolerances against CPU fp32. fp32: summation order only. bf16 has an 8-bit mantissa (relative rounding
# 2^-9 ≈ 2e-3 per op), compounded over layers; a log-prob of about -4.6 (99-way) then moves by a few 1e-2.
# Losses are compared as |Δ| / max(|loss|, 1): at ratio 1 the policy loss is −mean(A) of whitened advantages,
# zero up to float noise, so a purely relative difference would divide by that noise (seen on the first GPU run).
TOLERANCES = {
    "fp32": {"logprob_max": 1e-4, "logprob_mean": 1e-5, "value_max": 1e-4, "loss": 1e-4, "grad_norm_rel": 1e-3},
    "bf16": {"logprob_max": 1.5e-1, "logprob_mean": 2e-2, "value_max": 3e-2, "loss": 5e-2, "grad_norm_rel": 1e-1},
}
CLIP, VALUE_CLIP, MAX_GRAD_NORM = 0.2, 0.5, 1.0


def prompts_and_answers(tokenizer, count: int, seed: int = 0) -> tuple[list[list[int]], list[str]]:
    """Tiny-math training prompts through the tokenizer's chat template, as the trainer builds them."""
    stream = TinyMathStream(TinyMathConfig(), seed)
    problems = [stream[i] for i in range(count)]
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p.question}], add_generation_prompt=True, tokenize=False
        )
        for p in problems
    ]
    return tokenizer(texts, add_special_tokens=False)["input_ids"], [p.answer for p in problems]


def build_models(shape: TinyModelConfig, tokenizer, seed: int = 0) -> tuple[nn.Module, ValueModel]:
    """Random-init policy and critic (fp32, CPU) of ``shape``, seeded like the trainer's workers."""
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    policy = build_causal_lm(None, shape, len(tokenizer), pad, eos, seed)
    critic = ValueModel(build_backbone(None, tiny_qwen2_config(shape, len(tokenizer), pad, eos), seed), seed=seed)
    return policy, critic


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device, precision: str):
    """bf16 matmuls over fp32 master weights; softmax, log-softmax and loss sums stay fp32 (autocast's lists)."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()


def with_targets(exp: Experience, policy, critic, seed: int = 1) -> Experience:
    """Old log-probs, old values, seeded rewards, GAE advantages and returns, all from CPU fp32."""
    with torch.no_grad():
        old_logprobs = logprobs_from_logits(
            policy(input_ids=exp.input_ids, attention_mask=exp.attention_mask).logits, exp.input_ids
        )
        old_values = critic.values(exp.input_ids, exp.attention_mask)
    rewards = torch.rand(exp.batch_size, generator=torch.Generator().manual_seed(seed))
    token_rewards = token_level_rewards(rewards, exp.response_mask)
    advantages, returns = compute_advantages(token_rewards, old_values, exp.response_mask, 1.0, 1.0, 1.0, True)
    return exp.replace(
        old_logprobs=old_logprobs, old_values=old_values, rewards=rewards, advantages=advantages, returns=returns
    )


def ppo_loss_sum(name: str, model, exp: Experience) -> torch.Tensor:
    """The clipped policy loss (``name == "policy"``) or value loss of ``exp``, summed over its tokens."""
    if name == "policy":
        logits = model(input_ids=exp.input_ids, attention_mask=exp.attention_mask).logits
        loss, _ = policy_loss(
            logprobs_from_logits(logits, exp.input_ids),
            exp.old_logprobs,
            exp.advantages,
            exp.response_mask,
            CLIP,
            CLIP,
            gen_logprobs=exp.gen_logprobs,
        )
    else:
        values = model.values(exp.input_ids, exp.attention_mask)
        loss, _ = value_loss(values, exp.old_values, exp.returns, exp.response_mask, VALUE_CLIP)
    return loss


def losses_and_grads(policy, critic, exp: Experience, device: torch.device, precision: str) -> dict:
    """Policy and critic loss (token mean over the batch) and gradient norms of one update's backward."""
    out = {}
    tokens = exp.response_mask.sum()
    for name, model in (("policy", policy), ("critic", critic)):
        model.zero_grad(set_to_none=True)
        with autocast(device, precision):
            loss = ppo_loss_sum(name, model, exp)
        (loss.float() / tokens).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        out[f"{name}_loss"], out[f"{name}_grad_norm"] = float(loss.detach() / tokens), float(norm)
        model.zero_grad(set_to_none=True)
    return out


def evaluate(policy, critic, exp: Experience, device: torch.device, precision: str) -> dict:
    """Log-probs and values (bf16 parameters when precision is bf16), then losses and gradient norms."""
    infer_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    exp = exp.to(device)
    with torch.no_grad():
        p = copy.deepcopy(policy).to(device, infer_dtype).eval()
        c = copy.deepcopy(critic).to(device, infer_dtype).eval()
        result = {
            "logprobs": logprobs_from_logits(
                p(input_ids=exp.input_ids, attention_mask=exp.attention_mask).logits, exp.input_ids
            ).cpu(),
            "values": c.values(exp.input_ids, exp.attention_mask).float().cpu(),
        }
        del p, c
    train_p, train_c = copy.deepcopy(policy).to(device).train(), copy.deepcopy(critic).to(device).train()
    return result | losses_and_grads(train_p, train_c, exp, device, precision)


def compare(ref: dict, got: dict, mask: torch.Tensor, precision: str, label: str) -> dict:
    tol = TOLERANCES[precision]
    valid = mask.bool()
    lp_diff = (ref["logprobs"] - got["logprobs"]).abs()[valid]
    row = {
        "check": label,
        "precision": precision,
        "logprob_max_abs_diff": float(lp_diff.max()),
        "logprob_mean_abs_diff": float(lp_diff.mean()),
        "value_max_abs_diff": float((ref["values"] - got["values"]).abs()[valid].max()),
    }
    for key in ("policy_loss", "critic_loss"):
        row[key], row[f"{key}_reference"] = got[key], ref[key]
        row[f"{key}_diff"] = abs(ref[key] - got[key]) / max(abs(ref[key]), 1.0)
    for key in ("policy_grad_norm", "critic_grad_norm"):
        row[f"{key}_rel_diff"] = abs(ref[key] - got[key]) / max(abs(ref[key]), 1e-12)
    limits = {
        "logprob_max_abs_diff": tol["logprob_max"],
        "logprob_mean_abs_diff": tol["logprob_mean"],
        "value_max_abs_diff": tol["value_max"],
        "policy_loss_diff": tol["loss"],
        "critic_loss_diff": tol["loss"],
        "policy_grad_norm_rel_diff": tol["grad_norm_rel"],
        "critic_grad_norm_rel_diff": tol["grad_norm_rel"],
    }
    row["tolerances"] = limits
    row["passed"] = all(math.isfinite(row[k]) and row[k] <= limit for k, limit in limits.items())
    return row


def numerics(device: torch.device, batch: int, new_tokens: int) -> list[dict]:
    """The tiny recipe's models on a CPU-sampled rollout: device results against CPU fp32."""
    tok = build_char_tokenizer()
    policy, critic = build_models(RECIPE_TINY, tok)
    prompts, _ = prompts_and_answers(tok, batch)
    generator = TorchGenerator(policy.eval(), (tok.eos_token_id,), tok.pad_token_id)
    exp = generator.sample(SampleRequest(prompts, SamplingParams(new_tokens), stream_key(0, 0), torch.arange(batch)))
    exp = with_targets(exp, policy, critic)
    reference = evaluate(policy, critic, exp, torch.device("cpu"), "fp32")
    if device.type == "cpu":
        return [
            compare(
                reference,
                evaluate(policy, critic, exp, device, "fp32"),
                exp.response_mask,
                "fp32",
                "cpu fp32 vs cpu fp32 (smoke: plumbing only)",
            )
        ]
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, False
    rows = [
        compare(
            reference,
            evaluate(policy, critic, exp, device, "fp32"),
            exp.response_mask,
            "fp32",
            "cuda fp32 (TF32 off) vs cpu fp32",
        )
    ]
    rows.append(
        compare(
            reference,
            evaluate(policy, critic, exp, device, "bf16"),
            exp.response_mask,
            "bf16",
            "cuda bf16 params / bf16 autocast, fp32 reductions vs cpu fp32",
        )
    )
    return rows


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
        timeout=timeout,
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
    profile_dir: Path | None = None,
    model_dir: Path | None = None,
    model_shape: dict | None = None,
    vocab: int | None = None,
) -> dict:
    """The real `PPOTrainer.step` (through `dtppo ppo` and its workers) on a Qwen2.5-0.5B-shaped random model
    (CUDA) or a 64-hidden one (CPU fallback), or on ``model_dir`` (of ``model_shape`` and ``vocab``): one warm-up
    step, then ``args.steps`` measured ones. Per-phase seconds are the trainer's own `timing/*` metrics (medians
    over the measured steps)."""
    shape = model_shape or vars(QWEN25_05B if cuda else CPU_SMOKE)
    steps = args.steps + 1
    batch_keys = [
        f"{role}.{key}={n}"
        for role in ("policy", "value")
        for key, n in (("train_global_batch_size", args.batch), ("train_micro_batch_size", args.micro))
    ]
    model = [f"policy.model.path={model_dir}"] if model_dir else shape_overrides(shape)  # the critic starts from it
    overrides = [
        "ppo.init_from_sft=false",
        f"ppo.max_num_steps={steps}",
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
        *backend_overrides,
        *args.override,
    ]
    with tempfile.TemporaryDirectory() as tmp:
        proc, records, seconds = run_dtppo(
            overrides,
            Path(tmp) / "log",
            cuda,
            timeout=1800,
            extra_env={PROFILE_ENV: str(profile_dir)} if profile_dir else None,
        )
    measured = [r for r in records if "timing/step" in r][1:]
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
    }
    if proc.returncode or not measured:
        return result | {"passed": False}
    last = measured[-1]
    return (
        result
        | _step_figures(measured, shape, result["vocab_size"], args.batch, cuda)
        | {
            "last_step": {
                k: last.get(k)
                for k in (
                    "train/reward",
                    "train/loss",
                    "train/critic/loss",
                    "train/token_mult_prob_error",
                    "train/critic/explained_var",
                )
            },
            "passed": all(
                isinstance(last.get(k), float) and math.isfinite(last[k])
                for k in ("train/reward", "train/loss", "train/critic/loss", "train/token_mult_prob_error")
            ),
        }
    )


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


def throughput_table(cuda: bool, args) -> dict:
    """Issue 23, item 3: the step at Qwen2.5-0.5B's and -1.5B's shapes with the 151,936-entry vocabulary (model
    directories written by bench/common/shapes.py, random bf16 weights), one process. Goals: each update >= 25 % of
    the bf16 peak at 0.5B and >= 35 % at 1.5B. CPU fallback: the smoke shape with a 512-entry vocabulary."""
    device = torch.device("cuda" if cuda else "cpu")
    vocab = QWEN25_VOCAB if cuda else 512
    goals = {"0.5b": 0.25, "1.5b": 0.35}
    rows = []
    for name in ("0.5b", "1.5b") if cuda else ("smoke",):
        with tempfile.TemporaryDirectory() as tmp:
            shape = write_model_dir(Path(tmp) / "model", name, vocab, device)
            run = trainer_steps(cuda, args, model_dir=Path(tmp) / "model", model_shape=shape, vocab=vocab)
        rows.append({"shape": name, "update_peak_fraction_goal": goals.get(name)} | run)
    return {"rows": rows, "passed": all(r["passed"] for r in rows)}


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
    rows = features_rows(24, (1,), os.environ.get("DTPPO_GPU_COMMAND", "python -m bench.device.check"))
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
    rows = lora_rows(24, (1,), os.environ.get("DTPPO_GPU_COMMAND", "python -m bench.device.check"))
    by = {r["mode"]: r for r in rows}
    passed = all(by[m]["device_resident_MiB"] < by["full"]["device_resident_MiB"] for m in ("lora-r16", "lora-r64"))
    return {"rows": rows, "passed": passed}


def features_smoke(cuda: bool) -> dict:
    """The tiny recipe for 2 PPO steps with activation checkpointing and CPU offload on for policy (and its
    reference: KL on) and critic: the workers build, train, refit and validate with both. CPU fallback: skipped
    (tests/distributed/test_memory_features.py builds the workers with both flags on 2 gloo ranks)."""
    if not cuda:
        return {"skipped": "CPU fallback"}
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


def update_profile(cuda: bool, args) -> dict:
    """The same steps with the updates under torch.profiler (``DTPPO_PROFILE_DIR``, dtppo.observability.profiling):
    for the critic's and the policy's last update, the total self time on the device (CPU in the fallback) and the top
    operators, so the critic/policy gap has a kernel-level account (each profile's ``wall_s`` is its update alone).
    A separate run: the profiler slows the steps it records and writes its files inside the timed phases, so the
    step's timings come from the unprofiled run."""
    with tempfile.TemporaryDirectory() as tmp:
        run = trainer_steps(cuda, args, profile_dir=Path(tmp) / "profile")
        files = sorted((Path(tmp) / "profile").glob("*_rank0_call*.json"))
        by_model = {}
        for file in files:  # the last call per model: after the warm-up step
            summary = json.loads(file.read_text())
            if summary["call"] >= by_model.get(summary["model"], {}).get("call", 0):
                by_model[summary["model"]] = summary
    keys = "total_self_device_ms" if cuda else "total_self_cpu_ms"
    policy, value = by_model.get("policy"), by_model.get("value")
    return {
        "exit_code": run["exit_code"],
        "stderr_tail": run["stderr_tail"],
        "profiles": {
            name: {k: v for k, v in p.items() if k != "top"} | {"top": p["top"][:12]} for name, p in by_model.items()
        },
        "critic_over_policy_self_time": value[keys] / policy[keys] if policy and value and policy[keys] else None,
        "passed": run["passed"] and policy is not None and value is not None,
    }


def long_responses(cuda: bool) -> dict:
    """Item 8 above; the CPU fallback runs the tiny shape at 256 tokens. A pass that runs out of device memory is
    recorded as such (and fails the phase)."""
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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true", help="the CPU fallback even where CUDA is available")
    parser.add_argument("--batch", type=int, default=None, help="prompts per step (CUDA 128, CPU 8)")
    parser.add_argument("--new-tokens", type=int, default=None, help="max new tokens per response (CUDA 128, CPU 8)")
    parser.add_argument("--micro", type=int, default=None, help="rows per forward/backward (CUDA 32, CPU the batch)")
    parser.add_argument("--steps", type=int, default=None, help="measured steps after one warm-up (CUDA 3, CPU 1)")
    parser.add_argument("--override", action="append", default=[], help="extra `dtppo ppo` key=value for the step")
    parser.add_argument("--decode-prompts", type=int, default=None, help="decode bench rows (CUDA 256, CPU 4)")
    parser.add_argument("--decode-tokens", type=int, default=None, help="decode bench new tokens (CUDA 512, CPU 8)")
    parser.add_argument(
        "--decode-full-on-cpu",
        action="store_true",
        help="CPU fallback: also the compiled decode variants (minutes of compilation)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="JSON path (CUDA: bench/results/device/gpu.json; CPU fallback: runs/gpu-check-cpu.json)",
    )
    args = parser.parse_args()
    cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda") if cuda else torch.device("cpu")
    args.batch = args.batch or (128 if cuda else 8)
    args.new_tokens = args.new_tokens or (128 if cuda else 8)
    args.steps = args.steps or (3 if cuda else 1)
    args.micro = args.micro or (32 if cuda else args.batch)
    args.decode_prompts = args.decode_prompts or (256 if cuda else 4)
    args.decode_tokens = args.decode_tokens or (512 if cuda else 8)
    # A CPU fallback run is a smoke test of the plumbing: it never lands under the GPU result's name.
    out = Path(args.out or (DEVICE / "gpu.json" if cuda else REPO / "runs" / "gpu-check-cpu.json"))
    if not cuda:
        # Tiny matmuls gain nothing from a second thread, and on a loaded machine OpenMP's barrier waits on a
        # descheduled thread make them tens of times slower: the smoke test stays on one thread.
        torch.set_num_threads(1)
    torch.manual_seed(0)
    checks = numerics(device, batch=16 if cuda else 4, new_tokens=24 if cuda else 8)
    result = {
        "mode": "cuda" if cuda else "cpu-fallback",
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "command": os.environ.get("DTPPO_GPU_COMMAND", "python -m bench.device.check " + " ".join(sys.argv[1:])),
        "numerics": checks,
        "numerics_passed": all(c["passed"] for c in checks),
        "step": trainer_steps(cuda, args),
        "step_vllm": vllm_steps(cuda, args),
        "checkpoint_resume": checkpoint_resume(cuda),
        "memory_features": memory_features(cuda),
        "memory_lora": memory_lora(cuda),
        "features_smoke": features_smoke(cuda),
        "update_profile": update_profile(cuda, args),
        "throughput_table": throughput_table(cuda, args),
        "decode": decode_speed(cuda, args.decode_prompts, args.decode_tokens, args.decode_full_on_cpu),
        "quickstart": quickstart(cuda),
        "long_responses": long_responses(cuda),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    _print(result)
    print(f"wrote {out}")
    checks = (
        result["numerics_passed"],
        result["step"]["passed"],
        result["step_vllm"].get("passed", True),
        result["checkpoint_resume"]["passed"],
        result["memory_features"].get("passed", True),
        result["memory_lora"].get("passed", True),
        result["features_smoke"].get("passed", True),
        result["update_profile"]["passed"],
        result["throughput_table"]["passed"],
        result["quickstart"]["passed"],
        result["long_responses"]["passed"],
    )
    return 0 if all(checks) else 1


def _print(result: dict) -> None:
    print(f"mode {result['mode']} on {result['device']}")
    print(f"{'numerics check':<64}{'lp max':>9}{'lp mean':>9}{'v max':>9}{'loss':>10}{'gn rel':>9}  ok")
    for c in result["numerics"]:
        loss = max(c["policy_loss_diff"], c["critic_loss_diff"])
        grad = max(c["policy_grad_norm_rel_diff"], c["critic_grad_norm_rel_diff"])
        print(
            f"{c['check']:<64}{c['logprob_max_abs_diff']:>9.1e}{c['logprob_mean_abs_diff']:>9.1e}"
            f"{c['value_max_abs_diff']:>9.1e}{loss:>10.1e}{grad:>9.1e}  {'yes' if c['passed'] else 'NO'}"
        )
    s = result["step"]
    head = (
        f"dtppo ppo, PPOTrainer.step ({s['model_shape']['hidden_size']}h x {s['model_shape']['num_layers']}L, "
        f"{s['precision']}, {s['batch']} prompts x <={s['max_new_tokens']} new tokens)"
    )
    if not s["passed"]:
        print(f"{head}: FAILED (exit {s['exit_code']})\n{s['stderr_tail']}")
    else:
        t = s["timing_s_median"]
        print(
            f"{head}: {t['timing/step']:.3f} s/step, {s['tokens_per_s']:.0f} tok/s, generation "
            f"{s['generated_tokens_per_s']:.0f} tok/s, ~{s['achieved_tflops']:.3g} TFLOP/s = "
            f"{100 * s['peak_fraction']:.1f}% of the measured {s['peak_matmul_dtype']} matmul peak "
            f"({s['peak_tflops']:.3g} TFLOP/s)"
        )
        print("timing/* medians (s): " + ", ".join(f"{k.removeprefix('timing/')} {v:.3f}" for k, v in t.items()))
    v = result["step_vllm"]
    if "skipped" in v:
        print(f"backend=vllm: skipped ({v['skipped']})")
    else:
        t = v.get("timing_s_median", {})
        print(
            f"backend=vllm: exit {v['exit_code']}, {t.get('timing/step', float('nan')):.3f} s/step, generation "
            f"{t.get('timing/generation', float('nan')):.3f} s, "
            f"weight_refit {t.get('timing/weight_refit', float('nan')):.3f} s, "
            f"token_mult_prob_error {v.get('last_step', {}).get('train/token_mult_prob_error')}  "
            f"{'ok' if v['passed'] else 'FAILED'}"
        )
        if v.get("stderr_tail"):
            print(v["stderr_tail"])
    c = result["checkpoint_resume"]
    print(
        f"tiny recipe 2 steps + resume to 3: exit {c['exit_codes']}, steps {c['steps_logged']}, resumed "
        f"{c['resumed']}, {sum(c['seconds']):.1f} s  {'ok' if c['passed'] else 'FAILED'}"
    )
    if c["stderr_tail"]:
        print(c["stderr_tail"])
    m = result["memory_features"]
    if "skipped" in m:
        print(f"memory features: skipped ({m['skipped']})")
    else:
        for r in m["rows"]:
            print(
                f"memory features: {r['role']:<7}{r['feature']:<26}device MiB: resident "
                f"{r['device_resident_MiB']:>7.0f}, held after forward {r['device_held_after_forward_MiB']:>7.0f}, "
                f"fwd+bwd peak +{r['device_fwd_bwd_peak_added_MiB']:.0f}, optimizer peak "
                f"+{r['device_optimizer_peak_added_MiB']:.0f}; {r['fwd_bwd_s']:.2f} + {r['optimizer_s']:.2f} s"
            )
        print(f"memory features: offload lowers the resident, AC the held: {'ok' if m['passed'] else 'FAILED'}")
    lora = result["memory_lora"]
    if "skipped" in lora:
        print(f"memory LoRA: skipped ({lora['skipped']})")
    else:
        for r in lora["rows"]:
            print(
                f"memory LoRA: {r['mode']:<10} device MiB: resident {r['device_resident_MiB']:>7.0f}, warm-up peak "
                f"{r['device_peak_MiB']:>7.0f}; AdamW state {r['optimizer_state_MiB']:.0f}"
            )
        print(f"memory LoRA: adapters hold less than full fine-tuning: {'ok' if lora['passed'] else 'FAILED'}")
    f = result["features_smoke"]
    if "skipped" in f:
        print(f"tiny recipe with AC + CPU offload: skipped ({f['skipped']})")
    else:
        print(
            f"tiny recipe 2 steps, AC + CPU offload on: exit {f['exit_code']}, {f['seconds']:.1f} s  "
            f"{'ok' if f['passed'] else 'FAILED'}"
        )
        if f["stderr_tail"]:
            print(f["stderr_tail"])
    _print_issue23(result["update_profile"], result["throughput_table"], result["decode"])
    q = result["quickstart"]
    memory = q["max_memory_allocated_gib"]
    print(
        f"quickstart {q['recipe']} ({q['shape']} shape, 2 steps): exit {q['exit_codes']}, {q['seconds']:.1f} s, "
        f"peak {'n/a' if memory is None else f'{memory:.1f} GiB'}, checkpoints {q['checkpoints']}, "
        f"exported {q['exported']}  {'ok' if q['passed'] else 'FAILED'}"
    )
    if q["stderr_tail"]:
        print(q["stderr_tail"])
    for row in result["long_responses"]["rows"]:
        cells = f"{row['seconds']:.2f} s, peak {row['peak_mib']:.0f} MiB" if "seconds" in row else row["failed"]
        print(f"long responses: {row['what']} at T={row['T']} ({row['layout']}, cp {row['cp']}): {cells}")


def _print_issue23(prof: dict, table: dict, decode: dict) -> None:
    ratio = prof["critic_over_policy_self_time"]
    print(
        f"update profile: exit {prof['exit_code']}, critic/policy self time "
        f"{'n/a' if ratio is None else f'{ratio:.2f}'}  {'ok' if prof['passed'] else 'FAILED'}"
    )
    for name, p in prof["profiles"].items():
        print(
            f"  {name} update, top operators by {p['ranked_by']}: "
            + "; ".join(f"{op['name']} {op[p['ranked_by']]:.1f} ms x{op['calls']}" for op in p["top"][:6])
        )
    if prof["stderr_tail"]:
        print(prof["stderr_tail"])
    for r in table["rows"]:
        if not r["passed"]:
            print(f"throughput {r['shape']}: FAILED (exit {r['exit_code']})\n{r['stderr_tail']}")
            continue
        fractions = ", ".join(f"{k} {100 * v:.1f}%" for k, v in r["update_peak_fraction"].items())
        memory = r["max_memory_allocated_gib"]
        print(
            f"throughput {r['shape']} (V = {r['vocab_size']}): {r['timing_s_median']['timing/step']:.2f} s/step, "
            f"generation {r['generated_tokens_per_s']:.0f} tok/s, of peak: {fractions} "
            f"(goal {r['update_peak_fraction_goal']}), max memory "
            f"{'n/a' if memory is None else f'{memory:.1f} GiB'}; shares: "
            + ", ".join(f"{k} {100 * v:.0f}%" for k, v in r["phase_share"].items() if v >= 0.01)
        )
    for name, v in decode["variants"].items():
        print(
            f"decode {decode['prompts']} x {decode['new_tokens']}: {name:<40}{v['tokens_per_s']:>10.0f} tok/s "
            f"(first call {v['first_call_s']:.1f} s)"
        )
    if "goals" in decode:
        g = decode["goals"]
        print(
            f"decode: graph/eager {g['graph_over_eager']:.2f}x (goal >= {g['graph_over_eager_goal']:.0f}x), "
            f"graph/transformers {g['graph_over_transformers']:.2f}x (goal >= {g['graph_over_transformers_goal']}x); "
            f"identical rows {decode['graph_vs_eager']['identical_rows']:.2f}"
        )


if __name__ == "__main__":
    sys.exit(main())
