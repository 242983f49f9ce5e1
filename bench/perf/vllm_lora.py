"""A LoRA policy on the vLLM backend, the two ways an engine can follow the trainer (docs/lora.md): dtppo's merged
refit (the adapters merged into the weights and streamed through ``reload_weights``; the engine serves a plain
model) against vLLM's own LoRA path (the engine serves the frozen base with ``enable_lora``; after each update the
adapter is written in PEFT's format and loaded as a new ``LoRARequest``). Per round, one simulated update (the
adapter's B moves), then for each way: the seconds to hand the engine the new policy, the seconds of a rollout
(``--batch`` prompts of 24 tokens, ``--new-tokens`` each, T = 1, EOS disabled), and the largest difference between
the engine's log-probs of the sampled tokens and the trainer's (fp32). Demo model (~1M parameters) and the ~20M
model of bench/common/workload.py, LoRA rank 8 on every linear layer. Interleaved rounds, medians; one OpenMP thread, as
the vllm backend runs on CPU. Prints a table and writes bench/results/perf/vllm_lora.json.

    python -m bench.perf.vllm_lora [--batch 64] [--new-tokens 48] [--rounds 5] [--models tiny,20m]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch starts its OpenMP pool

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.common.paths import PERF, REPO
from bench.common.record import command_line, write_record
from dtppo import config as config_lib
from dtppo.config import LoraConfig
from dtppo.generation.vllm_engine import VLLMEngine  # sets vLLM's in-process environment
from dtppo.models.causal_lm import build_causal_lm
from dtppo.models.logprobs import token_logprobs
from dtppo.models.lora import add_adapters, frozen_base, merged_model, save_adapter
from dtppo.models.tokenizer import build_char_tokenizer

RECIPE = REPO / "recipes" / "tiny-math-cpu.yaml"
MODELS = {  # policy.model.tiny shapes: the demo's, and bench/common/workload.py's ~20M model
    "tiny": {},
    "20m": {"hidden_size": 512, "num_layers": 6, "num_heads": 8, "num_kv_heads": 4, "intermediate_size": 1536},
}
LORA = LoraConfig(rank=8, alpha=16.0)
PROMPT_TOKENS = 24


def move_adapter(model: torch.nn.Module, generator: torch.Generator) -> None:
    """A simulated update: every adapter's B takes a random step (B starts at 0, so the first makes it matter)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)


def rollout(llm, prompts: list[list[int]], new_tokens: int, lora_request=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [B, prompt + new] and the engine's log-probs of the new tokens [B, new]."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    requests = [
        SamplingParams(temperature=1.0, max_tokens=new_tokens, ignore_eos=True, logprobs=0, detokenize=False, seed=i)
        for i in range(len(prompts))
    ]
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts], requests, use_tqdm=False, lora_request=lora_request
    )
    ids, logprobs = [], []
    for prompt, output in zip(prompts, outputs):
        sample = output.outputs[0]
        ids.append(prompt + list(sample.token_ids))
        logprobs.append([step[tok].logprob for tok, step in zip(sample.token_ids, sample.logprobs)])
    return torch.tensor(ids), torch.tensor(logprobs)


def logprob_gap(model: torch.nn.Module, ids: torch.Tensor, engine_logprobs: torch.Tensor) -> float:
    """max |engine − trainer| over the sampled tokens."""
    mask = torch.zeros(ids.shape, dtype=torch.bool)
    mask[:, PROMPT_TOKENS:] = True
    with torch.no_grad():
        trainer = token_logprobs(model, ids, torch.ones_like(ids), mask, 1.0, 128)[:, PROMPT_TOKENS:]
    return float((trainer - engine_logprobs).abs().max())


def measure_model(name: str, args, command: str) -> list[dict]:
    from vllm import LLM
    from vllm.lora.request import LoRARequest

    tok = build_char_tokenizer()
    cfg = config_lib.load(
        RECIPE, ["ppo.init_from_sft=false", *[f"policy.model.tiny.{k}={v}" for k, v in MODELS[name].items()]]
    )
    model = build_causal_lm(None, cfg.policy.model.tiny, len(tok), tok.pad_token_id, tok.eos_token_id, 0).eval()
    add_adapters(model, LORA, seed=0)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, len(tok), (PROMPT_TOKENS,), generator=g).tolist() for _ in range(args.batch)]
    max_len = PROMPT_TOKENS + args.new_tokens
    merged_engine = VLLMEngine(merged_model(model), (-1,), tok.pad_token_id, max_len, 256, 0, torch.device("cpu"))
    with tempfile.TemporaryDirectory(prefix="dtppo-vllm-lora-") as tmp:
        frozen_base(model).save_pretrained(f"{tmp}/base")
        lora_llm = LLM(
            model=f"{tmp}/base",
            skip_tokenizer_init=True,
            dtype=torch.float32,
            seed=0,
            max_model_len=max_len,
            kv_cache_memory_bytes=256 << 20,
            enable_prefix_caching=False,
            enforce_eager=True,
            logprobs_mode="processed_logprobs",
            enable_chunked_prefill=False,
            enable_lora=True,
            max_lora_rank=LORA.rank,
            max_loras=1,
        )
        seconds = {k: [] for k in ("merged_refit", "merged_rollout", "lora_load", "lora_rollout")}
        gaps = {"merged": [], "lora": []}
        for step in range(1, args.rounds + 2):  # the first round warms both engines up and is not counted
            move_adapter(model, g)
            t0 = time.perf_counter()
            merged_engine.refit(model, step)
            t1 = time.perf_counter()
            ids, logprobs = rollout(merged_engine.llm, prompts, args.new_tokens)
            t2 = time.perf_counter()
            gaps["merged"].append(logprob_gap(model, ids, logprobs))

            t3 = time.perf_counter()
            request = LoRARequest(f"step{step}", step, str(save_adapter(model, LORA, f"{tmp}/a{step}", None)))
            lora_llm.llm_engine.add_lora(request)
            if step > 1:
                lora_llm.llm_engine.remove_lora(step - 1)
            t4 = time.perf_counter()
            ids, logprobs = rollout(lora_llm, prompts, args.new_tokens, request)
            t5 = time.perf_counter()
            gaps["lora"].append(logprob_gap(model, ids, logprobs))
            if step > 1:
                for key, value in zip(seconds, (t1 - t0, t2 - t1, t4 - t3, t5 - t4)):
                    seconds[key].append(value)
    params = sum(p.numel() for n, p in model.named_parameters() if ".lora_" not in n)  # the base's
    common = {"model": name, "parameters": params, "lora_rank": LORA.rank, "command": command}
    tokens = args.batch * args.new_tokens
    rows = []
    for way, hand_over in (("merged", "merged_refit"), ("lora", "lora_load")):
        rollout_s = statistics.median(seconds[f"{way}_rollout"])
        rows.append(
            common
            | {
                "way": "merged refit (dtppo)" if way == "merged" else "vLLM LoRA (enable_lora, LoRARequest)",
                "hand_over_s_median": statistics.median(seconds[hand_over]),
                "rollout_s_median": rollout_s,
                "tokens_per_s": tokens / rollout_s,
                "max_abs_logprob_gap": max(gaps[way]),
                "seconds_all": {k: v for k, v in seconds.items() if k.startswith(way)},
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default="tiny,20m")
    parser.add_argument("--out", type=Path, default=PERF / "vllm_lora.json")
    args = parser.parse_args()
    command = command_line()
    rows = [row for name in args.models.split(",") for row in measure_model(name, args, command)]
    print(f"\n{'model':<6}{'way':<40}{'hand-over s':>12}{'rollout s':>11}{'tok/s':>9}{'max |Δ logp|':>14}")
    for r in rows:
        print(
            f"{r['model']:<6}{r['way']:<40}{r['hand_over_s_median']:>12.4f}{r['rollout_s_median']:>11.3f}"
            f"{r['tokens_per_s']:>9.0f}{r['max_abs_logprob_gap']:>14.2e}"
        )
    meta = {"measured_at": time.strftime("%Y-%m-%d %H:%M"), "load_average_1min": os.getloadavg()[0]}
    write_record(args.out, {"meta": meta, "rows": rows}, command, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
