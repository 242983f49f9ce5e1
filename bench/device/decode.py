"""Decode throughput (bench/device/gpu.sh, phases ``decode`` and ``hf_generate``): dtppo's torch sampler eager and as
compiled graphs (``policy.generation.decode_graph``: one CUDA graph replayed per token), and ``transformers.generate``
with a static cache and its own torch.compile, on one model, prompts and lengths (EOS off: every row decodes every
token), each warmed up (compiling) then timed once. On CUDA: Qwen2.5-0.5B's shape and vocabulary, bf16, 256 x 256 by
default; the CPU smoke test decodes a tiny model eagerly only (``full_on_cpu`` adds the compiled variant: minutes;
tests/unit/generation/test_generator_decode_graph.py tests its equality)."""

from __future__ import annotations

import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from bench.common.shapes import QWEN_05B, SHAPES
from dtppo.generation.generator import TorchGenerator
from dtppo.types import SampleRequest, SamplingParams

PROMPT_TOKENS = 64
SMOKE = SHAPES["smoke"] | {"vocab_size": 99, "tie_word_embeddings": True}
NO_EOS = -1  # an id no model samples


def _model(cuda: bool) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(**(QWEN_05B if cuda else SMOKE), max_position_embeddings=4096)
    config._attn_implementation = "sdpa"
    model = Qwen2ForCausalLM(config).eval()
    return model.to("cuda", torch.bfloat16) if cuda else model


def _timed(run) -> tuple[torch.Tensor, float, float]:
    """(output, first-call seconds, second-call seconds), synchronised."""
    times, out = [], None
    for _ in range(2):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return out, times[0], times[1]


def _hf_generate(model, ids: torch.Tensor, new_tokens: int):
    """``transformers.generate`` sampling at T = 1 from the full vocabulary with a static cache; transformers
    compiles the forward itself on CUDA when the cache is static."""
    model.generation_config.cache_implementation = "static"

    sampling = dict(do_sample=True, top_k=0, top_p=1.0, temperature=1.0, eos_token_id=None, pad_token_id=0)

    def run():
        mask, length = torch.ones_like(ids), dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens)
        return model.generate(input_ids=ids, attention_mask=mask, **sampling, **length)[:, ids.shape[1] :]

    return run


def _rows(variants: dict, prompts: int, new_tokens: int) -> tuple[dict, dict]:
    rows, outputs = {}, {}
    for name, run in variants.items():
        with torch.no_grad():
            out, first, second = _timed(run)
        outputs[name] = out
        rows[name] = {"first_call_s": first, "seconds": second, "tokens_per_s": prompts * new_tokens / second}
    return rows, outputs


def _prompts(model, prompts: int) -> torch.Tensor:
    return torch.randint(
        3, model.config.vocab_size, (prompts, PROMPT_TOKENS), generator=torch.Generator().manual_seed(1)
    )


def decode_speed(cuda: bool, prompts: int, new_tokens: int, full_on_cpu: bool = False) -> dict:
    """Tokens/s of dtppo's eager decoding and (on CUDA, or ``full_on_cpu``) of ``decode_graph``: the decoder each
    chose, whether inductor captured CUDA graphs (its counters: a skipped capture runs the compiled code without
    graphs, silently), the graph's agreement with eager decoding and the goal's verdict."""
    model = _model(cuda)
    token_lists = _prompts(model, prompts).tolist()
    params, sample_ids = SamplingParams(new_tokens), torch.arange(prompts)
    generators = {"dtppo eager": TorchGenerator(model, (NO_EOS,), 0)}
    if cuda or full_on_cpu:  # keeps its compiled decoders
        generators["dtppo decode_graph"] = TorchGenerator(model, (NO_EOS,), 0, compile=True)
    counters = torch._dynamo.utils.counters["inductor"]
    counters.clear()
    rows, outputs = _rows(
        {
            name: (lambda g=g: g.sample(SampleRequest(token_lists, params, 7, sample_ids)))
            for name, g in generators.items()
        },
        prompts,
        new_tokens,
    )
    result = {
        "model": QWEN_05B if cuda else SMOKE,
        "dtype": "bfloat16" if cuda else "float32",
        "prompts": prompts,
        "prompt_tokens": PROMPT_TOKENS,
        "new_tokens": new_tokens,
        "decoders": {name: g.describe() for name, g in generators.items()},
        "variants": rows,
    }
    if "dtppo decode_graph" not in outputs:
        return result
    eager, graph = outputs["dtppo eager"], outputs["dtppo decode_graph"]
    same = (eager.input_ids == graph.input_ids).all(-1)
    skips = int(counters.get("cudagraph_skips", 0))
    result["inductor_counters"] = dict(counters)
    result["cuda_graphs_captured"] = cuda and skips == 0
    result["graph_vs_eager"] = {
        # With random weights at a 151k vocabulary every token has probability ~7e-6, so bf16 kernels fused
        # differently flip most draws: few identical rows is expected there and is not a graph bug.
        "identical_rows": float(same.float().mean()),
        "max_abs_logprob_diff_on_identical_rows": float(
            ((graph.gen_logprobs - eager.gen_logprobs).abs() * eager.response_mask)[same].max()
        )
        if same.any()
        else None,
    }
    speedup = rows["dtppo decode_graph"]["tokens_per_s"] / rows["dtppo eager"]["tokens_per_s"]
    result["goals"] = {"graph_over_eager": speedup, "graph_over_eager_goal": 6.0}
    return result


def hf_generate_speed(cuda: bool, prompts: int, new_tokens: int, graph_tokens_per_s: float | None) -> dict:
    """Tokens/s of ``transformers.generate`` with a static cache (it compiles its forward itself on CUDA) on the
    decode bench's model and prompts; against ``decode_graph``'s tokens/s where the decode phase measured it."""
    model = _model(cuda)
    ids = _prompts(model, prompts).to(next(model.parameters()).device)
    rows, _ = _rows({"transformers.generate (static cache)": _hf_generate(model, ids, new_tokens)}, prompts, new_tokens)
    result = {"prompts": prompts, "new_tokens": new_tokens, "variants": rows}
    if graph_tokens_per_s is not None:
        hf = rows["transformers.generate (static cache)"]["tokens_per_s"]
        result["goals"] = {"graph_over_transformers": graph_tokens_per_s / hf, "graph_over_transformers_goal": 0.5}
    return result
