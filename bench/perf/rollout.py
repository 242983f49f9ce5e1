"""Rollout throughput: dtppo's sampler (src/dtppo/generation/sampler.py) against transformers' ``model.generate``
on the same model, prompts and batch, sampling at T=1 from the full vocabulary, with EOS disabled on both
sides so that every row generates exactly ``--new-tokens`` tokens. fp32 on CPU. Prints a table and writes
bench/results/perf/rollout.json.

    python -m bench.perf.rollout [--batch 64] [--new-tokens 48] [--rounds 7] [--threads 2] [--no-compile]

Model and prompts: the tiny recipe's policy (recipes/tiny-math-cpu.yaml, random init) and its tiny-math
prompts. Variants run interleaved, round by round, so load from other processes falls on all of them; the
table shows medians. torch.compile's one-off compile time is reported separately and not in the throughput.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import transformers
from transformers import GenerationConfig

from bench.common.paths import PERF, REPO
from bench.common.record import command_line, write_record
from dtppo import config as config_lib
from dtppo.data.loader import PromptLoader, build_sources, encode_prompts
from dtppo.generation.decoder import StaticKVDecoder
from dtppo.generation.generator import TorchGenerator
from dtppo.models.causal_lm import build_causal_lm
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.types import SampleRequest, SamplingParams

RECIPE = REPO / "recipes" / "tiny-math-cpu.yaml"
GOAL = 2.0  # dtppo tokens/s at least this many times transformers'
NO_EOS = -1  # an id no model samples: rows never stop early


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention_mask) [B, W]: the layout both generators start from."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def build_variants(model, prompts, pad_id: int, new_tokens: int, compile: bool) -> dict:
    """name -> zero-argument callable generating ``new_tokens`` for every prompt; each returns [B, N] tokens."""
    ids, attn = left_padded(prompts, pad_id)
    sample_ids = torch.arange(len(prompts))
    # generate() fills a None eos_token_id from the model's own generation config: clear it there too.
    model.generation_config.eos_token_id = None

    def hf(cache: str | None):
        # top_k=0: HF's default top-k of 50 would sample from a truncated distribution; eos None: fixed length.
        config = GenerationConfig(
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            eos_token_id=None,
            pad_token_id=pad_id,
            cache_implementation=cache,
        )
        return lambda: model.generate(input_ids=ids, attention_mask=attn, generation_config=config)[:, ids.shape[1] :]

    def dtppo(compiled: bool):
        params = SamplingParams(new_tokens)
        generator = TorchGenerator(model, (NO_EOS,), pad_id, compile=compiled)  # keeps its compiled decoders

        def run():
            exp = generator.sample(SampleRequest(prompts, params, 1, sample_ids))
            return exp.input_ids[exp.response_mask.bool()].view(len(prompts), new_tokens)

        return run

    variants = {
        "transformers generate (dynamic cache)": hf(None),
        "transformers generate (static cache)": hf("static"),
        "dtppo sampler (eager)": dtppo(False),
    }
    if compile:
        variants["dtppo sampler (torch.compile)"] = dtppo(True)
    return variants


def prefill_seconds(model, prompts, pad_id: int, rounds: int) -> dict[str, float]:
    """Median time of the prompt forward alone, HF's and dtppo's: the part of a rollout no decode loop changes."""
    ids, attn = left_padded(prompts, pad_id)
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    times = {"transformers": [], "dtppo": []}
    with torch.no_grad():
        for _ in range(rounds):
            start = time.perf_counter()
            model(input_ids=ids, attention_mask=attn, position_ids=positions, logits_to_keep=1)
            times["transformers"].append(time.perf_counter() - start)
            start = time.perf_counter()
            StaticKVDecoder(model, ids.shape[0], ids.shape[1] + 1).prefill(ids, attn, positions)
            times["dtppo"].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    command = command_line()
    cfg = config_lib.load(RECIPE, ["ppo.init_from_sft=false"])
    tok = build_char_tokenizer()
    model = build_causal_lm(
        None, cfg.policy.model.tiny, len(tok), tok.pad_token_id, tok.eos_token_id, cfg.ppo.seed
    ).eval()
    problems = PromptLoader(build_sources(cfg)[0], cfg.ppo.seed).next_batch(args.batch)
    prompts = encode_prompts(tok, problems, cfg.data)
    variants = build_variants(model, prompts, tok.pad_token_id, args.new_tokens, not args.no_compile)
    load_before = os.getloadavg()
    first_call = {}
    for name, run in variants.items():  # warm-up; the compiled variant compiles here
        start = time.perf_counter()
        out = run()
        first_call[name] = time.perf_counter() - start
        assert out.shape == (args.batch, args.new_tokens), f"{name} generated {tuple(out.shape)}"
    times = {name: [] for name in variants}
    cpu_times = {name: [] for name in variants}  # process CPU time: leaves out waiting for a core
    for _ in range(args.rounds):
        for name, run in variants.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            run()
            times[name].append(time.perf_counter() - start)
            cpu_times[name].append(time.process_time() - cpu_start)
    prefill = prefill_seconds(model, prompts, tok.pad_token_id, args.rounds)
    rows = _rows(args, command, times, cpu_times, first_call, prefill)
    _print(rows, prefill)
    meta = {
        "args": vars(args),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "shared_machine": True,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "mean_prompt_tokens": statistics.mean(len(p) for p in prompts),
        "max_prompt_tokens": max(len(p) for p in prompts),
        "prefill_s_median": prefill,
    }
    write_record(PERF / "rollout.json", {"meta": meta, "rows": rows}, command, indent=2)


def _rows(args, command: str, times: dict, cpu_times: dict, first_call: dict, prefill: dict) -> list[dict]:
    tokens = args.batch * args.new_tokens
    peers = [n for n in times if n.startswith("transformers")]
    best_peer = min(peers, key=lambda n: statistics.median(times[n]))
    peer_s, peer_cpu = statistics.median(times[best_peer]), statistics.median(cpu_times[best_peer])
    rows = []
    for name, seconds in times.items():
        median, cpu = statistics.median(seconds), statistics.median(cpu_times[name])
        side = "dtppo" if name.startswith("dtppo") else "transformers"
        row = {
            "variant": name,
            "seconds_median": median,
            "cpu_seconds_median": cpu,
            "seconds_all": seconds,
            "tokens_per_s": tokens / median,
            # Decode alone: the rollout minus its prompt forward (measured separately, same model and batch).
            "decode_tokens_per_s": tokens / max(median - prefill[side], 1e-9),
            "command": command,
        }
        if side == "dtppo":
            row |= {
                "peer": best_peer,
                "speedup": peer_s / median,
                "cpu_time_speedup": peer_cpu / cpu,
                "decode_speedup": (peer_s - prefill["transformers"]) / max(median - prefill["dtppo"], 1e-9),
                "goal": GOAL,
                "meets_goal": peer_s / median >= GOAL,
            }
        if "compile" in name:
            # The first call minus a steady-state call: what compiling cost, once per process and shape.
            row["compile_s"] = first_call[name] - median
        rows.append(row)
    return rows


def _print(rows: list[dict], prefill: dict) -> None:
    print(
        f"{'variant':<40}{'s':>7}{'tok/s':>7}{'decode tok/s':>13}{'speedup':>8}{'cpu-time':>9}{'goal':>6}"
        f"{'compile s':>10}"
    )
    for r in rows:
        speedup = f"{r['speedup']:.2f}x" if "speedup" in r else "-"
        cpu_speedup = f"{r['cpu_time_speedup']:.2f}x" if "cpu_time_speedup" in r else "-"
        goal = f">={r['goal']:.0f}x" if "goal" in r else ""
        compile_s = f"{r['compile_s']:.1f}" if "compile_s" in r else ""
        print(
            f"{r['variant']:<40}{r['seconds_median']:>7.3f}{r['tokens_per_s']:>7.0f}{r['decode_tokens_per_s']:>13.0f}"
            f"{speedup:>8}{cpu_speedup:>9}{goal:>6}{compile_s:>10}"
        )
    print(f"prompt forward alone: transformers {prefill['transformers']:.3f} s, dtppo {prefill['dtppo']:.3f} s")
    print("(shared 2-core machine: other processes ran alongside; see load_average_* in the JSON)")


if __name__ == "__main__":
    main()
