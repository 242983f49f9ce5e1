"""The GPU check behind bench/gpu.sh: (1) the tiny recipe's numerics on the device against CPU fp32, (2) one
PPO step of a Qwen2.5-0.5B-shaped random model: seconds per phase, tokens/s, and the fraction of the matmul
peak measured in the same run, (3) the tiny recipe through the real CLI and workers for 2 PPO steps (on the
GPU in CUDA mode: the workers put their models on the rank's device). Writes one JSON file (default
bench/results/gpu.json).

On CUDA: numerics in fp32 (TF32 off) and in bf16 (bf16 parameters for inference, bf16 autocast over fp32
master weights for the update, every reduction in fp32), then the 0.5B-shaped step in bf16. Without CUDA (or
with --cpu): a smoke test of the same code in fp32 at tiny sizes that runs in a few seconds.
The CUDA path has not been run yet (no GPU was available when it was written).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
import transformers
from torch import nn

from dtppo.algorithms.advantages import compute_advantages, token_level_rewards
from dtppo.algorithms.losses import policy_loss, value_loss
from dtppo.config import TinyMathConfig, TinyModelConfig
from dtppo.data.tiny_math import TinyMathStream
from dtppo.models.causal_lm import build_causal_lm, tiny_qwen2_config
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.models.value import ValueModel, build_backbone
from dtppo.ops import logprobs_from_logits
from dtppo.rollout.sampler import SamplingParams, generate, stream_key
from dtppo.types import Experience

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workload import train_flops  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Qwen2.5-0.5B's transformer shape (its 151k vocabulary replaced by the project's character tokenizer).
QWEN25_05B = TinyModelConfig(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864,
                             max_position_embeddings=4096)
CPU_SMOKE = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
RECIPE_TINY = TinyModelConfig()  # the tiny recipe's policy and critic (recipes/base.yaml policy.model.tiny)
# Tolerances against CPU fp32. fp32: summation order only. bf16 has an 8-bit mantissa (relative rounding
# 2^-9 ≈ 2e-3 per op), compounded over layers; a log-prob of about -4.6 (99-way) then moves by a few 1e-2.
TOLERANCES = {
    "fp32": {"logprob_max": 1e-4, "logprob_mean": 1e-5, "value_max": 1e-4, "loss_rel": 1e-4, "grad_norm_rel": 1e-3},
    "bf16": {"logprob_max": 1.5e-1, "logprob_mean": 2e-2, "value_max": 3e-2, "loss_rel": 5e-2, "grad_norm_rel": 1e-1},
}
CLIP, VALUE_CLIP, MAX_GRAD_NORM = 0.2, 0.5, 1.0


def prompts_and_answers(tokenizer, count: int, seed: int = 0) -> tuple[list[list[int]], list[str]]:
    """Tiny-math training prompts through the tokenizer's chat template, as the trainer builds them."""
    stream = TinyMathStream(TinyMathConfig(), seed)
    problems = [stream[i] for i in range(count)]
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p.question}], add_generation_prompt=True,
                                           tokenize=False) for p in problems]
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


@contextmanager
def timed(seconds: dict[str, float], name: str, device: torch.device):
    sync(device)
    start = time.perf_counter()
    yield
    sync(device)
    seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start


def autocast(device: torch.device, precision: str):
    """bf16 matmuls over fp32 master weights; softmax, log-softmax and loss sums stay fp32 (autocast's lists)."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()


def with_targets(exp: Experience, policy, critic, seed: int = 1) -> Experience:
    """Old log-probs, old values, seeded rewards, GAE advantages and returns, all from CPU fp32."""
    with torch.no_grad():
        old_logprobs = logprobs_from_logits(policy(input_ids=exp.input_ids, attention_mask=exp.attention_mask).logits,
                                            exp.input_ids)
        old_values = critic.values(exp.input_ids, exp.attention_mask)
    rewards = torch.rand(exp.batch_size, generator=torch.Generator().manual_seed(seed))
    token_rewards = token_level_rewards(rewards, exp.response_mask)
    advantages, returns = compute_advantages(token_rewards, old_values, exp.response_mask, 1.0, 1.0, 1.0, True)
    return exp.replace(old_logprobs=old_logprobs, old_values=old_values, rewards=rewards, advantages=advantages,
                       returns=returns)


def ppo_loss_sum(name: str, model, exp: Experience) -> torch.Tensor:
    """The clipped policy loss (``name == "policy"``) or value loss of ``exp``, summed over its tokens."""
    if name == "policy":
        logits = model(input_ids=exp.input_ids, attention_mask=exp.attention_mask).logits
        loss, _ = policy_loss(logprobs_from_logits(logits, exp.input_ids), exp.old_logprobs, exp.advantages,
                              exp.response_mask, CLIP, CLIP, gen_logprobs=exp.gen_logprobs)
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
        result = {"logprobs": logprobs_from_logits(p(input_ids=exp.input_ids, attention_mask=exp.attention_mask).logits,
                                                   exp.input_ids).cpu(),
                  "values": c.values(exp.input_ids, exp.attention_mask).float().cpu()}
        del p, c
    train_p, train_c = copy.deepcopy(policy).to(device).train(), copy.deepcopy(critic).to(device).train()
    return result | losses_and_grads(train_p, train_c, exp, device, precision)


def compare(ref: dict, got: dict, mask: torch.Tensor, precision: str, label: str) -> dict:
    tol = TOLERANCES[precision]
    valid = mask.bool()
    lp_diff = (ref["logprobs"] - got["logprobs"]).abs()[valid]
    row = {
        "check": label, "precision": precision,
        "logprob_max_abs_diff": float(lp_diff.max()), "logprob_mean_abs_diff": float(lp_diff.mean()),
        "value_max_abs_diff": float((ref["values"] - got["values"]).abs()[valid].max()),
    }
    for key in ("policy_loss", "critic_loss", "policy_grad_norm", "critic_grad_norm"):
        row[f"{key}_rel_diff"] = abs(ref[key] - got[key]) / max(abs(ref[key]), 1e-12)
    limits = {"logprob_max_abs_diff": tol["logprob_max"], "logprob_mean_abs_diff": tol["logprob_mean"],
              "value_max_abs_diff": tol["value_max"], "policy_loss_rel_diff": tol["loss_rel"],
              "critic_loss_rel_diff": tol["loss_rel"], "policy_grad_norm_rel_diff": tol["grad_norm_rel"],
              "critic_grad_norm_rel_diff": tol["grad_norm_rel"]}
    row["tolerances"] = limits
    row["passed"] = all(math.isfinite(row[k]) and row[k] <= limit for k, limit in limits.items())
    return row


def numerics(device: torch.device, batch: int, new_tokens: int) -> list[dict]:
    """The tiny recipe's models on a CPU-sampled rollout: device results against CPU fp32."""
    tok = build_char_tokenizer()
    policy, critic = build_models(RECIPE_TINY, tok)
    prompts, _ = prompts_and_answers(tok, batch)
    exp = generate(policy.eval(), prompts, SamplingParams(new_tokens), tok.eos_token_id, tok.pad_token_id,
                   stream_key(0, 0), torch.arange(batch))
    exp = with_targets(exp, policy, critic)
    reference = evaluate(policy, critic, exp, torch.device("cpu"), "fp32")
    if device.type == "cpu":
        return [compare(reference, evaluate(policy, critic, exp, device, "fp32"), exp.response_mask, "fp32",
                        "cpu fp32 vs cpu fp32 (smoke: plumbing only)")]
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, False
    rows = [compare(reference, evaluate(policy, critic, exp, device, "fp32"), exp.response_mask, "fp32",
                    "cuda fp32 (TF32 off) vs cpu fp32")]
    rows.append(compare(reference, evaluate(policy, critic, exp, device, "bf16"), exp.response_mask, "bf16",
                        "cuda bf16 params / bf16 autocast, fp32 reductions vs cpu fp32"))
    return rows


def _reward_fn():
    """dtppo's verifier, or None where math-verify is not installed (the reward phase is then skipped)."""
    try:
        from dtppo.rewards.math import gsm8k_reward
    except ImportError:
        return None
    return gsm8k_reward


class PPOStep:
    """One PPO step on one device, assembled from dtppo's parts in PPOTrainer.step()'s order (SPEC §3):
    generate, reward, values, log-probs, GAE, critic update, policy update. Single process, no FSDP: the
    update runs bf16 autocast over fp32 master weights, close to FSDP2's MixedPrecisionPolicy(param_dtype=bf16,
    reduce_dtype=fp32) that dtppo.distributed.parallelize applies on CUDA. Every row generates exactly
    ``new_tokens`` tokens (EOS disabled), so each step does the same work."""

    def __init__(self, shape: TinyModelConfig, device: torch.device, precision: str, batch: int, new_tokens: int,
                 micro: int, compile: bool):
        self.tok = build_char_tokenizer()
        policy, critic = build_models(shape, self.tok)
        self.policy, self.critic = policy.to(device), critic.to(device)
        gen_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        self.rollout = copy.deepcopy(policy).to(device, gen_dtype).eval().requires_grad_(False)
        self.opt = {"policy": torch.optim.AdamW(self.policy.parameters(), lr=1e-6),
                    "critic": torch.optim.AdamW(self.critic.parameters(), lr=1e-5)}
        self.device, self.precision, self.batch, self.micro, self.compile = device, precision, batch, micro, compile
        self.params = SamplingParams(new_tokens)
        self.reward_fn = _reward_fn()

    def run(self, index: int, prompts: list[list[int]], answers: list[str]) -> tuple[dict[str, float], Experience]:
        seconds: dict[str, float] = {}
        dev = self.device
        with timed(seconds, "generation", dev):
            self.rollout.load_state_dict(self.policy.state_dict())  # casts the trained weights to the rollout dtype
            exp = generate(self.rollout, prompts, self.params, -1, self.tok.pad_token_id, stream_key(0, index),
                           torch.arange(len(prompts)), compile=self.compile)
        with timed(seconds, "reward", dev):
            rewards = torch.zeros(exp.batch_size)
            if self.reward_fn is not None:
                ids = exp.input_ids.masked_fill(exp.response_mask == 0, self.tok.pad_token_id).cpu()
                texts = self.tok.batch_decode(ids, skip_special_tokens=True)
                rewards = torch.tensor([self.reward_fn(t, a) for t, a in zip(texts, answers)])
        with timed(seconds, "value_inference", dev), torch.no_grad(), autocast(dev, self.precision):
            old_values = self.critic.values(exp.input_ids, exp.attention_mask).float()
        with timed(seconds, "policy_logprobs", dev), torch.no_grad(), autocast(dev, self.precision):
            logits = self.policy(input_ids=exp.input_ids, attention_mask=exp.attention_mask).logits
            old_logprobs = logprobs_from_logits(logits, exp.input_ids)
        with timed(seconds, "advantages", dev):
            token_rewards = token_level_rewards(rewards.to(dev), exp.response_mask)
            advantages, returns = compute_advantages(token_rewards, old_values, exp.response_mask, 1.0, 1.0, 1.0, True)
        exp = exp.replace(rewards=rewards, old_values=old_values, old_logprobs=old_logprobs, advantages=advantages,
                          returns=returns)
        with timed(seconds, "critic_update", dev):
            self._update("critic", exp)
        with timed(seconds, "policy_update", dev):
            self._update("policy", exp)
        return seconds, exp

    def _update(self, name: str, exp: Experience) -> None:
        """One minibatch = one AdamW step; loss sums divided by the minibatch's valid tokens (SPEC §3)."""
        model = self.policy if name == "policy" else self.critic
        model.train()
        tokens = exp.response_mask.sum().clamp(min=1)
        for start in range(0, exp.batch_size, self.micro):
            micro = exp.slice(start, start + self.micro)
            with autocast(self.device, self.precision):
                loss = ppo_loss_sum(name, model, micro)
            (loss.float() / tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        self.opt[name].step()
        self.opt[name].zero_grad(set_to_none=True)
        model.eval()


def step_flops(exp: Experience, shape: TinyModelConfig, vocab: int) -> float:
    """Useful model FLOPs of one step (bench/workload.py's formula, pad tokens not counted): generation ≈ one
    policy forward, value and log-prob forwards, then forward + backward of critic and policy."""
    lengths = exp.attention_mask.sum(-1).cpu()
    policy = train_flops(vars(shape), vocab, lengths) / 3  # one forward
    critic = train_flops(vars(shape), 1, lengths) / 3
    return 2 * policy + critic + 3 * (policy + critic)


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


def timing(device: torch.device, args) -> dict:
    shape = QWEN25_05B if device.type == "cuda" else CPU_SMOKE
    precision = "bf16" if device.type == "cuda" else "fp32"
    runner = PPOStep(shape, device, precision, args.batch, args.new_tokens, args.micro, args.compile)
    prompts, answers = prompts_and_answers(runner.tok, args.batch * (args.steps + 1))
    step_s, phases, flops, tokens = [], [], [], []
    for i in range(args.steps + 1):  # step 0 warms up (allocator, kernels, and compiles with --compile)
        rows = slice(i * args.batch, (i + 1) * args.batch)
        start = time.perf_counter()
        seconds, exp = runner.run(i, prompts[rows], answers[rows])
        if i > 0:
            step_s.append(time.perf_counter() - start)
            phases.append(seconds)
            flops.append(step_flops(exp, shape, len(runner.tok)))
            tokens.append(float(exp.attention_mask.sum()))
    peak_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    peak = matmul_peak(device, peak_dtype, 8192 if device.type == "cuda" else 1024, 20 if device.type == "cuda" else 5)
    median = statistics.median(step_s)
    achieved = statistics.median(f / s for f, s in zip(flops, step_s))
    return {
        "model_shape": vars(shape) | {"vocab_size": len(runner.tok)}, "precision": precision,
        "batch": args.batch, "new_tokens": args.new_tokens, "mean_prompt_tokens": statistics.mean(map(len, prompts)),
        "steps_measured": args.steps, "step_s_median": median, "step_s_all": step_s,
        "phases_s_median": {k: statistics.median(p[k] for p in phases) for k in phases[0]},
        "tokens_per_step": statistics.median(tokens), "tokens_per_s": statistics.median(tokens) / median,
        "generated_tokens_per_s": args.batch * args.new_tokens / statistics.median(p["generation"] for p in phases),
        "model_flops_per_step": statistics.median(flops), "achieved_tflops": achieved / 1e12,
        "peak_matmul_dtype": str(peak_dtype).removeprefix("torch."), "peak_tflops": peak / 1e12,
        "peak_fraction": achieved / peak, "reward": "math-verify" if runner.reward_fn else "skipped: no math-verify",
        "compile": args.compile,
    }


TRAINER_STEPS = 2


def trainer_run(cuda: bool) -> dict:
    """``dtppo ppo`` on the tiny recipe (random init, small batches) for TRAINER_STEPS steps in a subprocess, with
    CUDA visible only in CUDA mode: exit code, wall seconds, and the last step's headline metrics."""
    overrides = ["ppo.init_from_sft=false", f"ppo.max_num_steps={TRAINER_STEPS}", "ppo.num_prompts_per_step=16",
                 "ppo.max_val_samples=32", "ppo.val_batch_size=32", "policy.train_global_batch_size=8",
                 "policy.train_micro_batch_size=4", "value.train_global_batch_size=8",
                 "value.train_micro_batch_size=4", "reward.num_workers=0", "logger.progress=false"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", **({} if cuda else {"CUDA_VISIBLE_DEVICES": ""}))
    with tempfile.TemporaryDirectory() as tmp:
        paths = [f"logger.log_dir={tmp}/log", f"checkpointing.checkpoint_dir={tmp}/ckpt"]
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "dtppo", "ppo", str(ROOT / "recipes" / "tiny-math-cpu.yaml"),
                               *overrides, *paths], env=env, capture_output=True, text=True, timeout=900)
        seconds = time.perf_counter() - start
        log = Path(tmp) / "log" / "metrics.jsonl"
        records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    last = next((r for r in reversed(records) if "train/loss" in r), {})
    keys = ("train/reward", "train/loss", "train/critic/loss", "train/token_mult_prob_error")
    metrics = {k: last.get(k) for k in keys}
    return {"exit_code": proc.returncode, "seconds": seconds, "steps_logged": sum("train/loss" in r for r in records),
            "last_step_metrics": metrics, "stderr_tail": proc.stderr[-2000:] if proc.returncode else "",
            "passed": proc.returncode == 0 and all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true", help="the CPU fallback even where CUDA is available")
    parser.add_argument("--batch", type=int, default=None, help="prompts per step (CUDA 128, CPU 8)")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens per response (CUDA 128, CPU 8)")
    parser.add_argument("--micro", type=int, default=None, help="rows per forward/backward (CUDA 32, CPU the batch)")
    parser.add_argument("--steps", type=int, default=None, help="measured steps after one warm-up (CUDA 3, CPU 1)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the sampler's decode step")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu.json"))
    args = parser.parse_args()
    cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda") if cuda else torch.device("cpu")
    args.batch = args.batch or (128 if cuda else 8)
    args.new_tokens = args.new_tokens or (128 if cuda else 8)
    args.steps = args.steps or (3 if cuda else 1)
    args.micro = args.micro or (32 if cuda else args.batch)
    if not cuda:
        # Tiny matmuls gain nothing from a second thread, and on a loaded machine OpenMP's barrier waits on a
        # descheduled thread make them tens of times slower: the smoke test stays on one thread.
        torch.set_num_threads(1)
    torch.manual_seed(0)
    checks = numerics(device, batch=16 if cuda else 4, new_tokens=24 if cuda else 8)
    result = {
        "mode": "cuda" if cuda else "cpu-fallback",
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "command": os.environ.get("DTPPO_GPU_COMMAND", "python bench/gpu_check.py " + " ".join(sys.argv[1:])),
        "numerics": checks, "numerics_passed": all(c["passed"] for c in checks),
        "step": timing(device, args),
        "trainer": trainer_run(cuda),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    _print(result)
    return 0 if result["numerics_passed"] and result["trainer"]["passed"] else 1


def _print(result: dict) -> None:
    print(f"mode {result['mode']} on {result['device']}")
    print(f"{'numerics check':<64}{'lp max':>9}{'lp mean':>9}{'v max':>9}{'loss rel':>10}{'gn rel':>9}  ok")
    for c in result["numerics"]:
        loss = max(c["policy_loss_rel_diff"], c["critic_loss_rel_diff"])
        grad = max(c["policy_grad_norm_rel_diff"], c["critic_grad_norm_rel_diff"])
        print(f"{c['check']:<64}{c['logprob_max_abs_diff']:>9.1e}{c['logprob_mean_abs_diff']:>9.1e}"
              f"{c['value_max_abs_diff']:>9.1e}{loss:>10.1e}{grad:>9.1e}  {'yes' if c['passed'] else 'NO'}")
    s = result["step"]
    print(f"PPO step ({s['model_shape']['hidden_size']}h x {s['model_shape']['num_layers']}L, {s['precision']}, "
          f"batch {s['batch']} x {s['new_tokens']} new): {s['step_s_median']:.3f} s, {s['tokens_per_s']:.0f} tok/s, "
          f"generation {s['generated_tokens_per_s']:.0f} tok/s, {s['achieved_tflops']:.3g} TFLOP/s = "
          f"{100 * s['peak_fraction']:.1f}% of the measured {s['peak_matmul_dtype']} matmul peak "
          f"({s['peak_tflops']:.3g} TFLOP/s)")
    print("phases (s): " + ", ".join(f"{k} {v:.3f}" for k, v in s["phases_s_median"].items()))
    t = result["trainer"]
    print(f"dtppo ppo, tiny recipe, {TRAINER_STEPS} steps through the workers: exit {t['exit_code']}, "
          f"{t['seconds']:.1f} s, last step {t['last_step_metrics']}  {'ok' if t['passed'] else 'FAILED'}")
    if t["stderr_tail"]:
        print(t["stderr_tail"])


if __name__ == "__main__":
    sys.exit(main())
