"""bf16 log-probs of the generator and the trainer against fp32, on CPU: a tiny Qwen2 whose attention and head are
scaled so that scores and logits reach the sizes of real checkpoints (random weights give |logit| < 1, where bf16
rounding shows nothing). Prints a table and writes bench/results/perf/bf16_logprobs.json.

    python -m bench.perf.bf16_logprobs [--rows 16] [--new-tokens 48] [--out FILE]

The model is built once in fp32 and cast to bf16; the static-KV decoder samples from the bf16 model (eager, greedy
off, T = 1), then on the sampled tokens: the decoder's log-probs (``gen_logprobs``), the trainer's
(``models.logprobs.sequence_logprobs``, the chunked head) on the bf16 model, and the trainer's on the fp32 model
(the reference). Per pair: mean and max |Δ log-prob| over response tokens, and exp(mean |Δ|), the shape of
``train/token_mult_prob_error``. The decoder and the head compute their logits and decode-step scores in fp32
(issue 47); ``--label`` names the code measured, so a run of the earlier code sits beside it in the JSON (the
earlier code: ``git worktree add /tmp/before 7d16618``, this file copied into it, run there with
``--label "bf16 logits and decode scores (before)" --out`` this JSON).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from bench.common.paths import PERF
from bench.common.record import command_line, commit, write_record
from dtppo.config import TinyModelConfig
from dtppo.generation.generator import TorchGenerator
from dtppo.models.causal_lm import build_causal_lm
from dtppo.models.logprobs import sequence_logprobs
from dtppo.types import SampleRequest, SamplingParams

SHAPE = TinyModelConfig(
    hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=256, max_position_embeddings=256
)
VOCAB, PROMPT_TOKENS = 512, 32
# Attention scores of about 10-30; logits spread as a trained model's (std about 2) around a shared offset of
# about ±15 per position (one hidden feature, about ±10, read by every vocabulary row), as real logits sit at 10-20: the
# log-softmax ignores the offset, bf16 rounding at that size does not.
QK_SCALE, HEAD_SCALE, LOGIT_OFFSET = 8.0, 10.0, 24.0


def scaled_model() -> torch.nn.Module:
    model = build_causal_lm(None, SHAPE, VOCAB, pad_id=0, eos_id=1, seed=0).eval()
    # The tiny model ties its head to the input embeddings: untie, so that scaling the head leaves the inputs be.
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    model.config.tie_word_embeddings = False
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(QK_SCALE)
            layer.self_attn.k_proj.weight.mul_(QK_SCALE)
        model.lm_head.weight.mul_(HEAD_SCALE)
        model.lm_head.weight[:, 0] += LOGIT_OFFSET
    return model


def differences(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> dict:
    diff = (a - b).abs()[mask.bool()]
    return {"mean_abs": float(diff.mean()), "max_abs": float(diff.max()), "mult_error": math.exp(float(diff.mean()))}


def measure(rows: int, new_tokens: int) -> dict:
    torch.manual_seed(0)
    fp32 = scaled_model()
    bf16 = scaled_model().to(torch.bfloat16)
    prompts = torch.randint(2, VOCAB, (rows, PROMPT_TOKENS), generator=torch.Generator().manual_seed(1)).tolist()
    generator = TorchGenerator(bf16, (1,), 0, decoder="static")
    sampled = generator.sample(SampleRequest(prompts, SamplingParams(new_tokens), 7, torch.arange(rows)))
    with torch.no_grad():
        trainer = {
            name: sequence_logprobs(
                model, sampled.input_ids, sampled.attention_mask, sampled.response_mask.bool(), 1.0, 64, False
            )
            for name, model in (("bf16", bf16), ("fp32", fp32))
        }
        logits = fp32(input_ids=sampled.input_ids, attention_mask=sampled.attention_mask).logits
    mask = sampled.response_mask
    return {
        "shape": vars(SHAPE)
        | {"vocab_size": VOCAB, "qk_scale": QK_SCALE, "head_scale": HEAD_SCALE}
        | {"logit_offset": LOGIT_OFFSET},
        "rows": rows,
        "new_tokens": new_tokens,
        "fp32_logit_abs_mean": float(logits.abs().mean()),
        "fp32_logprob_mean": float((trainer["fp32"] * mask).sum() / mask.sum()),
        "generator_bf16_vs_trainer_bf16": differences(sampled.gen_logprobs, trainer["bf16"], mask),
        "generator_bf16_vs_fp32": differences(sampled.gen_logprobs, trainer["fp32"], mask),
        "trainer_bf16_vs_fp32": differences(trainer["bf16"], trainer["fp32"], mask),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--label", default="fp32 logits and decode scores")
    parser.add_argument("--out", type=Path, default=PERF / "bf16_logprobs.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # Rows of earlier runs stay beside this one: each names the commit it ran at, not only the record's.
    row = measure(args.rows, args.new_tokens) | {
        "code": args.label,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "command": command_line(),
        "commit": commit(),
    }
    runs = json.loads(args.out.read_text())["runs"] if args.out.exists() else []
    runs = [r for r in runs if (r["code"], r["cpu_capability"]) != (row["code"], row["cpu_capability"])] + [row]
    write_record(args.out, {"runs": runs}, row["command"])
    print(f"{'code':<40}{'kernels':<9}{'pair':<34}{'mean |Δ|':>10}{'max |Δ|':>10}{'exp(mean)':>11}")
    for run in runs:
        for pair in ("generator_bf16_vs_trainer_bf16", "generator_bf16_vs_fp32", "trainer_bf16_vs_fp32"):
            d = run[pair]
            print(
                f"{run['code']:<40}{run['cpu_capability']:<9}{pair:<34}{d['mean_abs']:>10.4f}{d['max_abs']:>10.4f}"
                f"{d['mult_error']:>11.4f}"
            )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
