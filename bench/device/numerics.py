"""The numerics check of the device script (bench/device/check.py, phase ``numerics``): the tiny recipe's policy and
critic on the device against CPU fp32 (log-probs, values, losses, gradient norms). This comparison alone has its own
small loss code (dtppo's loss functions on plain models).
"""

from __future__ import annotations

import copy
import math
from contextlib import nullcontext

import torch
from torch import nn

from dtppo.algorithms.advantages import compute_advantages, token_level_rewards
from dtppo.algorithms.losses import policy_loss, value_loss
from dtppo.config import TinyMathConfig, TinyModelConfig
from dtppo.data.tiny_math import TinyMathStream
from dtppo.generation.generator import TorchGenerator
from dtppo.generation.sampler import stream_key
from dtppo.models.causal_lm import build_causal_lm, tiny_qwen2_config
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.models.value import ValueModel, build_backbone
from dtppo.ops import logprobs_from_logits
from dtppo.types import Experience, SampleRequest, SamplingParams

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
    }
    limits |= {f"{m}_loss_diff": tol["loss"] for m in ("policy", "critic")}
    limits |= {f"{m}_grad_norm_rel_diff": tol["grad_norm_rel"] for m in ("policy", "critic")}
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
    checks = {"fp32": "cpu fp32 vs cpu fp32 (smoke: plumbing only)"}
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, False
        checks = {
            "fp32": "cuda fp32 (TF32 off) vs cpu fp32",
            "bf16": "cuda bf16 params / bf16 autocast, fp32 reductions vs cpu fp32",
        }
    return [
        compare(reference, evaluate(policy, critic, exp, device, precision), exp.response_mask, precision, label)
        for precision, label in checks.items()
    ]
