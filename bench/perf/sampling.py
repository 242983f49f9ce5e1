"""What sampling costs in a CPU decode step at a real vocabulary: Qwen2.5-0.5B's shape (151,936 tokens, random
weights, fp32), one static-KV decode step over ``--rows`` rows, next to what picking the tokens costs: greedy
(argmax), dtppo's counter-based sampler (one hashed uniform per row, inverse CDF) and a counter-based Gumbel-max (one
hashed uniform per vocabulary entry). The noise's share of a step is (pick − greedy pick) / (decode forward + pick);
variants run interleaved step by step, medians shown. ``--layers``: the bodies measured (24 is the 0.5B's; 2 leaves
mostly the LM head, where the share is largest). Writes bench/results/perf/sampling.json.

    python -m bench.perf.sampling [--layers 24 2] [--rows 32] [--steps 20] [--threads 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from bench.common.paths import PERF
from bench.common.record import command_line, write_record
from bench.common.shapes import QWEN_05B
from dtppo.generation.decoder import StaticKVDecoder
from dtppo.generation.sampler import counter_uniform, pick_tokens
from dtppo.types import SamplingParams

PROMPT_TOKENS = 64
GOAL = 0.20  # the noise at most this share of a decode step


def gumbel_max_pick(logits: torch.Tensor, key: int, rows: torch.Tensor, t: int) -> torch.Tensor:
    """A Gumbel-max pick at T = 1: Gumbel noise hashed per (row, t, vocabulary entry), argmax, and the
    chosen token's log-prob from a full log_softmax."""
    gumbel = (-torch.log(-torch.log(counter_uniform(key, rows, t, logits.shape[-1])))).float()
    tokens = (logits + gumbel).argmax(-1)
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, nargs="+", default=[24, 2])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", default=str(PERF / "sampling.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    command = command_line()
    load_before = os.getloadavg()
    rows_out = []
    for layers in args.layers:
        rows = _rows(step_times(layers, args.rows, args.steps), command, layers)
        _print(rows, args, layers)
        rows_out += rows
    meta = {
        "args": vars(args),
        "vocab_size": QWEN_05B["vocab_size"],
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "shared_machine": True,
    }
    write_record(args.out, {"meta": meta, "rows": rows_out}, command, indent=2)


def step_times(layers: int, num_rows: int, steps: int) -> dict[str, list[float]]:
    """Seconds per decode step of each variant, interleaved step by step, from a 64-token random prompt."""
    torch.manual_seed(0)
    config = Qwen2Config(**(QWEN_05B | {"num_hidden_layers": layers}), max_position_embeddings=4096)
    model = Qwen2ForCausalLM(config).eval()
    rows = torch.arange(num_rows)
    ids = torch.randint(0, config.vocab_size, (num_rows, PROMPT_TOKENS))
    decoder = StaticKVDecoder(model, num_rows, PROMPT_TOKENS + steps + 1)
    rotations = decoder.rotations((PROMPT_TOKENS + torch.arange(steps + 1))[None].expand(num_rows, -1))
    params, greedy = SamplingParams(steps), SamplingParams(steps, greedy=True)
    times = {
        name: []
        for name in ("decode forward", "pick: greedy", "pick: dtppo (inverse CDF)", "pick: Gumbel-max (per entry)")
    }
    with torch.no_grad():
        logits = decoder.prefill(ids, torch.ones_like(ids), torch.arange(PROMPT_TOKENS).expand(num_rows, -1))
        for t in range(steps):
            uniform = counter_uniform(7, rows, t, 1)[:, 0]
            picks = {
                "pick: greedy": lambda: pick_tokens(logits, greedy, None),
                "pick: dtppo (inverse CDF)": lambda: pick_tokens(logits, params, uniform),
                "pick: Gumbel-max (per entry)": lambda: gumbel_max_pick(logits, 7, rows, t),
            }
            for name, pick in picks.items():
                start = time.perf_counter()
                pick()
                times[name].append(time.perf_counter() - start)
            tokens, _ = pick_tokens(logits, params, uniform)
            start = time.perf_counter()
            logits = decoder.decode(tokens, PROMPT_TOKENS + t, rotations[:, t])
            times["decode forward"].append(time.perf_counter() - start)
    return times


def _rows(times: dict[str, list[float]], command: str, layers: int) -> list[dict]:
    median = {name: statistics.median(seconds) for name, seconds in times.items()}
    rows = []
    for name, seconds in times.items():
        row = {
            "layers": layers,
            "variant": name,
            "ms_median": 1e3 * median[name],
            "ms_all": [1e3 * s for s in seconds],
            "command": command,
        }
        if name.startswith("pick:") and name != "pick: greedy":
            noise = median[name] - median["pick: greedy"]
            row |= {
                "noise_ms": 1e3 * noise,
                "step_ms": 1e3 * (median["decode forward"] + median[name]),
                "noise_share_of_step": noise / (median["decode forward"] + median[name]),
                "goal": GOAL,
            }
            row["meets_goal"] = row["noise_share_of_step"] <= GOAL
        rows.append(row)
    return rows


def _print(rows: list[dict], args, layers: int) -> None:
    print(
        f"{args.rows} rows, Qwen2.5-0.5B shape with {layers} layers, V = 151,936, fp32, "
        f"{args.threads} threads; medians over {args.steps} decode steps"
    )
    print(f"{'variant':<30}{'ms':>9}{'noise ms':>10}{'step ms':>9}{'noise share':>13}")
    for r in rows:
        noise = (
            f"{r['noise_ms']:>10.1f}{r['step_ms']:>9.1f}{100 * r['noise_share_of_step']:>12.1f}%"
            if "noise_ms" in r
            else ""
        )
        print(f"{r['variant']:<30}{r['ms_median']:>9.1f}{noise}")


if __name__ == "__main__":
    main()
