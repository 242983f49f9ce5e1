"""The training workload the throughput benches share (bench/perf/train_flops.py, scaling.py; bench/device/step.py):
a Qwen2-shaped policy and critic (~20M parameters each) trained by dtppo's workers on a synthetic rollout batch with
a realistic length spread, the FLOP count of that training pass and this machine's fp32 matmul peak.

FLOPs are useful model FLOPs: pad tokens are not counted, so padded and packed runs of one batch compare directly.
Per sequence of ℓ real tokens, one forward + backward (backward = 2x forward) costs 6 · N_mm · ℓ in matmuls (N_mm:
the weights a token meets in matmuls, the output layer included: h·V for the policy's LM head, h·1 for the critic's
value head) and 6 · n_layers · d_attn · ℓ(ℓ+1) in attention (QKᵀ and A·V over the ℓ(ℓ+1)/2 causal pairs). Embedding
lookups, norms, rotary, softmax, losses and AdamW are not counted: they show up as the gap to the matmul peak.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from bench.common.paths import REPO
from dtppo import config as config_lib
from dtppo.config import TinyModelConfig
from dtppo.models.packing import pack_rows
from dtppo.types import Experience, build_response_mask

RECIPE = str(REPO / "recipes" / "tiny-math-cpu.yaml")

# Qwen2 layout (GQA with 2 KV heads, SwiGLU, RMSNorm, QKV bias) scaled to ~20M parameters per model.
MODEL_20M = dict(hidden_size=512, num_layers=6, num_heads=8, num_kv_heads=2, intermediate_size=1792)
MODEL_20M["max_position_embeddings"] = 512
# The demo recipe's model (dtppo.config.TinyModelConfig defaults), ~1M parameters.
MODEL_TINY = dataclasses.asdict(TinyModelConfig())
MODELS = {"20m": MODEL_20M, "tiny": MODEL_TINY}


def make_config(model: dict, batch: int, micro: int, packing: bool, extra: list[str] = ()) -> config_lib.Config:
    """The demo recipe with both models replaced by ``model``, one optimizer step per train() call."""
    overrides = [f"{w}.model.tiny.{k}={v}" for w in ("policy", "value") for k, v in model.items()]
    overrides += ["ppo.init_from_sft=false", f"ppo.num_prompts_per_step={batch}", "logger.tensorboard=false"]
    for role in ("policy", "value"):
        overrides += [f"{role}.train_global_batch_size={batch}", f"{role}.train_micro_batch_size={micro}"]
        overrides += [f"{role}.sequence_packing={packing}"]
    overrides += [f"policy.logprob_batch_size={micro}", f"value.inference_batch_size={micro}", *extra]
    return config_lib.load(RECIPE, overrides)


def rollout_batch(vocab: int, batch: int, seq: int, seed: int = 0) -> Experience:
    """Rows ``[prompt | response | pad]`` with the length spread of RL rollouts, the longest ``seq`` tokens.

    Prompts: uniform in [seq/8, 3·seq/8]. Responses: log-normal with median seq/4 (σ = 0.7), cut at the
    generation limit ``seq − 3·seq/8``: a tail of rows is truncated there, as a generation cap does.
    """
    g = torch.Generator().manual_seed(seed)
    max_prompt, max_new = 3 * seq // 8, seq - 3 * seq // 8
    prompt = torch.randint(seq // 8, max_prompt + 1, (batch,), generator=g)
    response = (torch.randn(batch, generator=g) * 0.7).exp() * (seq / 4)
    response = response.round().long().clamp(4, max_new)
    width = int((prompt + response).max())
    attention = (torch.arange(width)[None] < (prompt + response)[:, None]).long()
    mask = build_response_mask(prompt, response, width)
    return Experience(
        input_ids=torch.randint(3, vocab, (batch, width), generator=g) * attention,
        attention_mask=attention,
        response_mask=mask,
        gen_logprobs=torch.zeros(batch, width),
        truncated=response == max_new,
        rewards=torch.rand(batch, generator=g),
        advantages=torch.randn(batch, width, generator=g) * mask,
        returns=torch.randn(batch, width, generator=g) * mask,
    )


def matmul_params_per_token(model: dict, head_out: int) -> int:
    """N_mm: weights a token meets in matmuls, decoder layers plus an output layer of ``head_out`` units."""
    h, ff = model["hidden_size"], model["intermediate_size"]
    head_dim = h // model["num_heads"]
    d_attn, d_kv = model["num_heads"] * head_dim, model["num_kv_heads"] * head_dim
    per_layer = h * d_attn + 2 * h * d_kv + d_attn * h + 3 * h * ff
    return model["num_layers"] * per_layer + h * head_out


def train_flops(model: dict, head_out: int, lengths: torch.Tensor) -> float:
    """Useful FLOPs of one forward + backward over sequences of ``lengths`` [B] real tokens (module doc)."""
    d_attn = model["num_heads"] * (model["hidden_size"] // model["num_heads"])
    ell = lengths.double()
    dense = 6.0 * matmul_params_per_token(model, head_out) * ell.sum()
    attention = 6.0 * model["num_layers"] * d_attn * (ell * (ell + 1)).sum()
    return float(dense + attention)


def matmul_peak_gflops(n: int = 2048, reps: int = 5) -> dict[str, float]:
    """Best fp32 rate of ``n × n`` matmuls (``a @ b`` and ``a @ b.T``) with the current thread count.

    Returns {"wall": GFLOP per second, "cpu": GFLOP per CPU-second of this process}. On a machine shared
    with other work the CPU-time rate is the steadier one: time this process was not scheduled costs no
    CPU time (spin-waiting threads do, so it is still a lower bound).
    """
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    best = {"wall": 0.0, "cpu": 0.0}
    for rhs in (b, b.t()):
        torch.mm(a, rhs)  # first call: allocation and MKL dispatch
        for _ in range(reps):
            wall, cpu = time.perf_counter(), time.process_time()
            torch.mm(a, rhs)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            best["wall"] = max(best["wall"], 2.0 * n**3 / wall / 1e9)
            best["cpu"] = max(best["cpu"], 2.0 * n**3 / max(cpu, 1e-9) / 1e9)
    return best


class Clock:
    """Wall and process-CPU seconds of a block: ``with Clock() as c: ...; c.wall, c.cpu``."""

    def __enter__(self) -> Clock:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall, self.cpu = time.perf_counter() - self._wall, time.process_time() - self._cpu


def executed_tokens(experience: Experience, micro: int, packing: bool, rows: slice | None = None) -> int:
    """Token positions the model really computes over ``experience`` in microbatches of ``micro`` rows:
    each microbatch is trimmed to its longest row, then either padded (rows × width) or packed."""
    local = experience if rows is None else experience.slice(rows.start, rows.stop)
    total = 0
    for start in range(0, local.batch_size, micro):
        part = local.slice(start, start + micro)
        if packing:
            packed = pack_rows(part.input_ids, part.attention_mask)
            total += packed.input_ids.numel()
        else:
            total += part.input_ids.numel()
    return total
