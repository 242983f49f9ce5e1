"""Does the static-KV decoder (src/dtppo/generation/decoder.py) keep its lead over HF's forward + cache on every
family it implements? Tokens per second of dtppo's torch sampler with each decoder, per family, at one small fixed
shape: hidden 256, 4 layers, 8 query / 2 key-value heads of 32, MLP 704, vocabulary 4,096, random init, fp32; 32
random prompts of 16-48 tokens (left-padded), 64 new tokens each, T = 1 over the full vocabulary, no stop token (every
row generates all 64). Families: Qwen2 (the reference), Qwen3 (q/k norms), Llama 3 (``llama3`` RoPE), Mistral
without and with a 32-token sliding window, Gemma 3 text (3 sliding layers of 32 tokens + 1 global). Prints a table
and writes bench/results/perf/decoder_families.json.

    python -m bench.perf.decoder_families [--rounds 3] [--families qwen2,qwen3,...]

The two decoders of a family run interleaved, round by round after one warm-up rollout each, so load from other
processes falls on both; medians of wall time (tok/s) and of this process's CPU time (tok/CPU-s). One OpenMP
thread: with two on a loaded 2-core machine, a thread waiting for its descheduled partner spins, and the same
rollout took 0.7 to 9.7 CPU-seconds from one round to the next.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch starts its OpenMP pool

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from bench.common.paths import PERF
from bench.common.record import command_line, write_record
from dtppo.generation.generator import TorchGenerator
from dtppo.types import SampleRequest, SamplingParams

BATCH, NEW_TOKENS, WINDOW = 32, 64, 32
NO_STOP = -1  # an id no model samples: rows never stop early
SHAPE = dict(
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=4096,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=1,
)
LLAMA3_ROPE = dict(
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=64,
    rope_theta=500000.0,
)
FAMILIES = {
    "qwen2": lambda: Qwen2Config(**SHAPE),
    "qwen3": lambda: Qwen3Config(**SHAPE),
    "llama3": lambda: LlamaConfig(**SHAPE, rope_parameters=LLAMA3_ROPE),
    "mistral": lambda: MistralConfig(**SHAPE, sliding_window=None),
    "mistral-window": lambda: MistralConfig(**SHAPE, sliding_window=WINDOW),
    "gemma3": lambda: Gemma3TextConfig(
        **SHAPE,
        sliding_window=WINDOW,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        query_pre_attn_scalar=32,
    ),
}


def measure(family: str, prompts: list[list[int]], rounds: int, command: str) -> list[dict]:
    """One row per decoder: the family's model, both decoders timed interleaved."""
    config = FAMILIES[family]()
    config._attn_implementation = "sdpa"  # as dtppo loads models
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    request = SampleRequest(prompts, SamplingParams(NEW_TOKENS), 1, torch.arange(len(prompts)))
    generators = {name: TorchGenerator(model, (NO_STOP,), 0, name) for name in ("static", "hf")}
    for generator in generators.values():  # warm-up
        assert int(generator.sample(request).response_mask.sum()) == BATCH * NEW_TOKENS
    times: dict[str, list[float]] = {name: [] for name in generators}
    cpu_times: dict[str, list[float]] = {name: [] for name in generators}
    load = os.getloadavg()[0]
    for _ in range(rounds):
        for name, generator in generators.items():
            t0, c0 = time.perf_counter(), time.process_time()
            generator.sample(request)
            times[name].append(time.perf_counter() - t0)
            cpu_times[name].append(time.process_time() - c0)
    tokens = BATCH * NEW_TOKENS
    rate = {name: tokens / statistics.median(s) for name, s in times.items()}
    return [
        {
            "family": family,
            "model_type": config.model_type,
            "decoder": name,
            "describe": generators[name].describe(),
            "tokens_per_s": rate[name],
            "tokens_per_cpu_s": tokens / statistics.median(cpu_times[name]),
            "static_over_hf": rate["static"] / rate["hf"],
            "seconds_all": times[name],
            "cpu_seconds_all": cpu_times[name],
            "load_average_1min_at_start": load,
            "command": command,
        }
        for name in generators
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--families", default=",".join(FAMILIES))
    args = parser.parse_args()
    command = command_line()
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(16, 49, (BATCH,), generator=generator).tolist()
    prompts = [torch.randint(2, SHAPE["vocab_size"], (n,), generator=generator).tolist() for n in lengths]
    print(
        f"{BATCH} prompts of 16-48 tokens x {NEW_TOKENS} new tokens, hidden 256, 4 layers, fp32, "
        f"{torch.get_num_threads()} thread(s), medians of {args.rounds} rounds; load: the 1-minute load average "
        "when a family started"
    )
    print(f"{'family':<16}{'static tok/s':>14}{'hf tok/s':>10}{'static/hf':>11}{'CPU-s ratio':>13}{'load':>7}")
    rows = []
    with torch.no_grad():
        for family in args.families.split(","):
            static, hf = measure(family, prompts, args.rounds, command)
            rows += [static, hf]
            print(
                f"{family:<16}{static['tokens_per_s']:>14.0f}{hf['tokens_per_s']:>10.0f}"
                f"{static['static_over_hf']:>10.2f}x{static['tokens_per_cpu_s'] / hf['tokens_per_cpu_s']:>12.2f}x"
                f"{static['load_average_1min_at_start']:>7.1f}"
            )
    meta = {
        "args": vars(args),
        "threads": torch.get_num_threads(),
        "batch": BATCH,
        "new_tokens": NEW_TOKENS,
        "shape": SHAPE,
        "window": WINDOW,
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    out = PERF / "decoder_families.json"
    write_record(out, {"meta": meta, "rows": rows}, command, indent=2)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
