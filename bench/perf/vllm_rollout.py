"""Rollout throughput of the generation backends side by side: the vllm backend's engine (in-process, eager), dtppo's
torch sampler with its static-KV decoder and with HF's forward + DynamicCache, and ``transformers``' ``generate``;
plus the engine's start-up and in-place refit times. The demo's model (~1M parameters) and bench/common/workload.py's
~20M one, random init, the same tiny-math prompts for every variant, T = 1 over the full vocabulary, EOS disabled so
that every row generates exactly ``--new-tokens`` tokens; fp32, one OpenMP thread (as the vllm backend runs on CPU).
Variants run interleaved round by round; medians of wall time (tok/s) and of this process's CPU time (tok/CPU-s,
which leaves out time spent waiting for a core). Writes bench/results/perf/vllm_rollout.json.

    python -m bench.perf.vllm_rollout [--batch 64] [--new-tokens 48] [--rounds 5] [--models tiny,20m]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch starts its OpenMP pool

import argparse
import statistics
import time

import torch
from transformers import GenerationConfig

from bench.common.paths import PERF, REPO
from bench.common.record import command_line, write_record
from bench.common.workload import MODELS
from dtppo import config as config_lib
from dtppo.data.chat import encode_prompts
from dtppo.data.loader import PromptLoader, build_sources
from dtppo.generation import sampler
from dtppo.generation.generator import TorchGenerator
from dtppo.models.causal_lm import build_causal_lm
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.types import SampleRequest

RECIPE = REPO / "recipes" / "tiny-math-cpu.yaml"
NO_EOS = -1  # an id no model samples: rows never stop early


def build_variants(model, engine, prompts: list[list[int]], pad_id: int, new_tokens: int) -> dict:
    """name -> zero-argument callable generating ``new_tokens`` for every prompt (returns the token count)."""
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.inputs import TokensPrompt

    ids, attn, _ = sampler.left_padded(prompts, pad_id, torch.device("cpu"))
    width = ids.shape[1]
    sample_ids, params = torch.arange(len(prompts)), sampler.SamplingParams(new_tokens)
    model.generation_config.eos_token_id = None

    def torch_sampler(static: bool):
        generator = TorchGenerator(model, (NO_EOS,), pad_id, "static" if static else "hf")

        def run():
            return int(generator.sample(SampleRequest(prompts, params, 1, sample_ids)).response_mask.sum())

        return run

    def hf_generate():
        sampling = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, eos_token_id=None, pad_token_id=pad_id)
        config = GenerationConfig(max_new_tokens=new_tokens, **sampling)
        return model.generate(input_ids=ids, attention_mask=attn, generation_config=config)[:, width:].numel()

    def vllm_engine():
        requests = [
            VLLMSamplingParams(
                temperature=1.0, max_tokens=new_tokens, ignore_eos=True, logprobs=0, detokenize=False, seed=i
            )
            for i in range(len(prompts))
        ]
        outputs = engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], requests, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs)

    return {
        "vllm engine (in-process, eager)": vllm_engine,
        "dtppo torch sampler, static-KV decoder (eager)": torch_sampler(True),
        "dtppo torch sampler, HF forward + DynamicCache": torch_sampler(False),
        "transformers generate (dynamic cache)": hf_generate,
    }


def timed(variants: dict, refit, args) -> tuple[dict, dict, list[float]]:
    """Each variant's wall and process-CPU seconds (CPU time leaves out waiting for a core), round by round after
    a warm-up, and a refit's seconds per round."""
    for run in variants.values():
        assert run() == args.batch * args.new_tokens
    times: dict[str, list[float]] = {v: [] for v in variants}
    cpu_times: dict[str, list[float]] = {v: [] for v in variants}
    refits = []
    with torch.no_grad():
        for _ in range(args.rounds):
            for variant, run in variants.items():
                t0, c0 = time.perf_counter(), time.process_time()
                run()
                times[variant].append(time.perf_counter() - t0)
                cpu_times[variant].append(time.process_time() - c0)
            t0 = time.perf_counter()
            refit()
            refits.append(time.perf_counter() - t0)
    return times, cpu_times, refits


def measure_model(name: str, args, prompts: list[list[int]], tok, command: str) -> list[dict]:
    from dtppo.generation.vllm_engine import VLLMEngine

    cfg = config_lib.load(
        RECIPE, ["ppo.init_from_sft=false", *[f"policy.model.tiny.{k}={v}" for k, v in MODELS[name].items()]]
    )
    model = build_causal_lm(
        None, cfg.policy.model.tiny, len(tok), tok.pad_token_id, tok.eos_token_id, cfg.ppo.seed
    ).eval()
    load = os.getloadavg()[0]
    start = time.perf_counter()
    engine = VLLMEngine(
        model,
        (NO_EOS,),
        tok.pad_token_id,
        max(len(p) for p in prompts) + args.new_tokens,
        256,
        cfg.ppo.seed,
        torch.device("cpu"),
    )
    startup = time.perf_counter() - start
    variants = build_variants(model, engine, prompts, tok.pad_token_id, args.new_tokens)
    times, cpu_times, refits = timed(variants, lambda: engine.refit(model, version=1), args)
    params = sum(p.numel() for p in model.parameters())
    common = {"model": name, "parameters": params, "load_average_1min_at_start": load, "command": command}
    tokens = args.batch * args.new_tokens
    rows = [
        common
        | {
            "variant": v,
            "tokens_per_s": tokens / statistics.median(s),
            "tokens_per_cpu_s": tokens / statistics.median(cpu_times[v]),
            "seconds_median": statistics.median(s),
            "seconds_all": s,
            "cpu_seconds_all": cpu_times[v],
        }
        for v, s in times.items()
    ]
    rows.append(common | {"variant": "vllm engine start-up (LLM(...) after import)", "seconds_median": startup})
    rows.append(
        common
        | {
            "variant": "vllm in-place refit (reload_weights, all parameters)",
            "seconds_median": statistics.median(refits),
            "seconds_all": refits,
        }
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default="tiny,20m")
    args = parser.parse_args()
    command = command_line()
    t0 = time.perf_counter()
    import vllm  # noqa: F401

    import_s = time.perf_counter() - t0
    cfg = config_lib.load(RECIPE, ["ppo.init_from_sft=false"])
    tok = build_char_tokenizer()
    problems = PromptLoader(
        build_sources(cfg.data, cfg.ppo.seed, cfg.ppo.validation.max_samples)[0], cfg.ppo.seed
    ).next_batch(args.batch)
    prompts = encode_prompts(tok, problems, cfg.data)
    rows = [row for name in args.models.split(",") for row in measure_model(name, args, prompts, tok, command)]
    print(
        f"import vllm: {import_s:.1f} s; {args.batch} prompts x {args.new_tokens} new tokens; 1 thread; "
        f"measured on a shared machine (1-min load average per model below)"
    )
    for r in rows:
        rate = (
            f"{r['tokens_per_s']:>8.0f} tok/s {r['tokens_per_cpu_s']:>8.0f} tok/CPU-s"
            if "tokens_per_s" in r
            else " " * 32
        )
        print(
            f"{r['model']:>5}  {r['variant']:<52} {rate}  {r['seconds_median']:8.3f} s  "
            f"load {r['load_average_1min_at_start']:.1f}"
        )
    meta = {
        "args": vars(args),
        "import_vllm_s": import_s,
        "threads": torch.get_num_threads(),
        "shared_machine": True,
        "torch": torch.__version__,
        "mean_prompt_tokens": statistics.mean(len(p) for p in prompts),
    }
    out = PERF / "vllm_rollout.json"
    write_record(out, {"meta": meta, "rows": rows}, command, indent=2)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
