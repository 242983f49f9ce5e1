"""Decode throughput for bench/device/gpu.sh (issue 23, item 1): dtppo's torch sampler eager and as compiled graphs
(``policy.generation.decode_graph``: one CUDA graph replayed per token), next to ``transformers.generate`` with a
static cache and its own torch.compile, on the same model, prompts and lengths (EOS off: every row decodes every
token). Each variant runs once to warm up (compiling), then once timed.

On CUDA: Qwen2.5-0.5B's shape with its 151,936-token vocabulary, random weights, bf16, ``prompts`` × ``new_tokens``
(256 × 512 by default). The CPU smoke test decodes a tiny model eagerly only, in seconds; ``full_on_cpu`` adds the
compiled variants there too (minutes of compilation; the compiled path's equality is tested in make test,
tests/unit/generation/test_decode_graph.py).
"""

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

    def run():
        return model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            top_k=0,
            top_p=1.0,
            temperature=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            eos_token_id=None,
            pad_token_id=0,
        )[:, ids.shape[1] :]

    return run


def decode_speed(cuda: bool, prompts: int, new_tokens: int, full_on_cpu: bool = False) -> dict:
    """Tokens/s of each variant, the graph's agreement with eager decoding, and the goals' verdicts."""
    model = _model(cuda)
    device = next(model.parameters()).device
    ids = torch.randint(
        3, model.config.vocab_size, (prompts, PROMPT_TOKENS), generator=torch.Generator().manual_seed(1)
    )
    token_lists = ids.tolist()
    params, sample_ids = SamplingParams(new_tokens), torch.arange(prompts)

    def dtppo(graph: bool):
        generator = TorchGenerator(model, (NO_EOS,), 0, compile=graph)  # keeps its compiled decoders
        return lambda: generator.sample(SampleRequest(token_lists, params, 7, sample_ids))

    variants = {"dtppo eager": dtppo(False)}
    if cuda or full_on_cpu:
        variants |= {
            "dtppo decode_graph": dtppo(True),
            "transformers.generate (static cache)": _hf_generate(model, ids.to(device), new_tokens),
        }
    rows, outputs = {}, {}
    for name, run in variants.items():
        with torch.no_grad():
            out, first, second = _timed(run)
        outputs[name] = out
        rows[name] = {"first_call_s": first, "seconds": second, "tokens_per_s": prompts * new_tokens / second}
    result = {
        "model": QWEN_05B if cuda else SMOKE,
        "dtype": "bfloat16" if cuda else "float32",
        "prompts": prompts,
        "prompt_tokens": PROMPT_TOKENS,
        "new_tokens": new_tokens,
        "variants": rows,
    }
    if "dtppo decode_graph" in outputs:
        eager, graph = outputs["dtppo eager"], outputs["dtppo decode_graph"]
        same = (eager.input_ids == graph.input_ids).all(-1)
        result["graph_vs_eager"] = {
            "identical_rows": float(same.float().mean()),
            # Where the rows agree, the log-probs should too (bf16 kernels fused differently: a few 1e-2 at most).
            "max_abs_logprob_diff_on_identical_rows": float(
                ((graph.gen_logprobs - eager.gen_logprobs).abs() * eager.response_mask)[same].max()
            )
            if same.any()
            else None,
        }
        speedup = rows["dtppo decode_graph"]["tokens_per_s"] / rows["dtppo eager"]["tokens_per_s"]
        hf = rows["transformers.generate (static cache)"]["tokens_per_s"]
        result["goals"] = {
            "graph_over_eager": speedup,
            "graph_over_eager_goal": 6.0,
            "graph_over_transformers": rows["dtppo decode_graph"]["tokens_per_s"] / hf,
            "graph_over_transformers_goal": 0.5,
        }
    return result
