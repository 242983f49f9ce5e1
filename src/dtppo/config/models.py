"""The models' sections: where weights come from (a path or a tiny random Qwen2), low-rank adapters, and how a
model's pool of ranks is split (data × context × tensor parallel)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dtppo.config.rules import at_least, require


@dataclass(frozen=True, kw_only=True)
class TinyModelConfig:
    """The shape of the tiny random-init Qwen2 built when a model has no ``path``."""

    hidden_size: int = 128
    """Width of the residual stream; an even multiple of ``num_heads`` (rotary embeddings)."""
    num_layers: int = 4
    """Decoder blocks."""
    num_heads: int = 4
    """Attention (query) heads."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention); divides ``num_heads``."""
    intermediate_size: int = 512
    """Width of the MLP's hidden layer."""
    max_position_embeddings: int = 512
    """Longest sequence (prompt + response) the rotary table covers."""

    def __post_init__(self) -> None:
        at_least(
            self,
            1,
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "max_position_embeddings",
        )
        require(
            self.hidden_size % (2 * self.num_heads) == 0,
            "hidden_size",
            "must be an even multiple of num_heads (rotary embeddings need an even head size)",
        )
        require(self.num_heads % self.num_kv_heads == 0, "num_kv_heads", "must divide num_heads")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Where a model's weights come from."""

    path: str | None = None
    """Local HF model directory (or a hub name like org/model); null = build ``tiny`` below (random init).
    For the critic, null = the policy's starting weights (a backbone copy), or a tiny random model."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Used only when ``path`` is null."""


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """How a model's pool of ranks is split: data-parallel (FSDP/HSDP) × context-parallel × tensor-parallel."""

    tp: int = 1
    """Tensor-parallel ranks per model replica; divides the pool's ranks."""
    cp: int = 1
    """Context-parallel ranks: each row of a microbatch is split over ``cp`` ranks, which exchange keys and values
    in attention (long responses). dp = the pool's ranks / (tp · cp)."""
    cp_layout: str = "zigzag"
    """How a row is split over the cp ranks: ``zigzag`` (rank r holds chunks r and 2·cp-1-r of 2·cp, the same
    causal-attention work on every rank) or ``contiguous``."""
    sequence_parallel: bool = False
    """Shard RMSNorm activations over the sequence too (needs tp > 1)."""
    unsharded_grad_accumulation: bool = True
    """FSDP: gather parameters once per optimizer step and reduce-scatter the microbatches' summed gradients
    once (false: per microbatch, less memory)."""
    dp_replicate: int = 1
    """Whole-model replicas among the data-parallel ranks (HSDP); = dp ranks: every rank holds the model and
    gradients are all-reduced once per step (no gathers)."""

    def __post_init__(self) -> None:
        require(self.tp >= 1, "tp", f"must be >= 1, got {self.tp}")
        require(not self.sequence_parallel or self.tp > 1, "sequence_parallel", "needs tp > 1")
        require(self.dp_replicate >= 1, "dp_replicate", f"must be >= 1, got {self.dp_replicate}")
        require(self.cp >= 1, "cp", f"must be >= 1, got {self.cp}")
        require(
            self.cp_layout in ("zigzag", "contiguous"),
            "cp_layout",
            f"must be zigzag or contiguous, got {self.cp_layout!r}",
        )


@dataclass(frozen=True, kw_only=True)
class LoraConfig:
    """Low-rank adapters (LoRA, Hu et al. 2021, through PEFT) instead of full fine-tuning: the model's weights stay
    frozen and each targeted linear layer learns W + (alpha / rank)·B·A. rank 0 = full fine-tuning."""

    rank: int = 0
    """r, the adapters' rank; 0 trains every weight (no adapters)."""
    alpha: float = 16.0
    """LoRA's alpha: the update is scaled by alpha / rank."""
    dropout: float = 0.0
    """Dropout on each adapter's input while training."""
    target_modules: tuple[str, ...] = ("all-linear",)
    """Module names that get adapters (PEFT's ``target_modules``); ``[all-linear]``: every linear layer of the
    decoder (not the LM head, not the critic's value head, which trains whole)."""
    adapter_path: str | None = None
    """A PEFT adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``) to start from instead of
    a fresh adapter (B = 0); its rank, alpha and target modules must be the ones above."""

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def __post_init__(self) -> None:
        require(self.rank >= 0, "rank", f"must be >= 0 (0 = no adapters), got {self.rank}")
        require(0.0 < self.alpha < math.inf, "alpha", f"must be finite and > 0, got {self.alpha}")
        require(0.0 <= self.dropout < 1.0, "dropout", f"must be in [0, 1), got {self.dropout}")
        require(len(self.target_modules) > 0, "target_modules", "must name at least one module (or all-linear)")
        require(
            "all-linear" not in self.target_modules or len(self.target_modules) == 1,
            "target_modules",
            "all-linear stands alone: it already names every linear layer",
        )
        require(self.adapter_path is None or self.enabled, "adapter_path", "needs rank > 0")
