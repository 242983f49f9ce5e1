"""The actor's section: its model, layout, optimizer, schedule, sampling and batch sizes."""

from __future__ import annotations

from dataclasses import dataclass, field

from dtppo.config.generation import GenerationConfig
from dtppo.config.models import LoraConfig, ModelConfig, ParallelConfig
from dtppo.config.optim import OptimizerConfig, SchedulerConfig
from dtppo.config.rules import at_least, require


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """The actor: its model, layout, optimizer, schedule, sampling and batch sizes."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy's starting weights (unless ``ppo.init_from_sft``)."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """The policy pool's layout."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """The policy's AdamW."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """The policy's learning-rate schedule."""
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    """Rollout sampling."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Adapters instead of full fine-tuning; the KL reference is then this model with its adapters off."""
    train_global_batch_size: int = 32
    """Samples per optimizer step (a minibatch); divides the samples per step and the data-parallel ranks."""
    train_micro_batch_size: int = 32
    """Most samples per forward/backward on one rank: clamped to the rank's share of the global batch (so any
    rank count works); must divide that share when smaller (``Config.micro_batch_size``)."""
    max_tokens_per_microbatch: int | None = None
    """Token-budget microbatches (verl's ``use_dynamic_bsz``): each rank groups its own rows of each minibatch into
    microbatches of at most this many real tokens (prompt + response), longest rows first, each into the first
    microbatch it fits (a longer row goes alone), and ``train_micro_batch_size`` is unused; data-parallel ranks
    split groups until they all run the same number. Same gradient under every ``loss.aggregation``. null = fixed
    microbatches of ``train_micro_batch_size`` rows."""
    logprob_batch_size: int = 64
    """Most samples per no-grad forward on one rank when recomputing log-probs."""
    logprob_chunk_size: int = 128
    """Response tokens per LM-head pass when computing log-probs (recompute and training): the extra memory is one
    ``[logprob_chunk_size, vocabulary]`` buffer instead of one per token of the batch (``models.logprobs``)."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global L2 norm."""
    sequence_packing: bool = True
    """Pack each (micro)batch's sequences into fewer rows, no pad tokens computed (same numbers as padded
    within fp32 round-off; docs/guides/performance.md)."""
    activation_checkpointing: bool = False
    """Keep only each decoder block's input in training and recompute the block in backward (non-reentrant, per
    block): what the forward holds for backward shrinks to the blocks' inputs (plus one block's activations while
    it recomputes), for about one more forward per update. Same numbers; eval forwards are unaffected
    (docs/guides/performance-memory.md)."""
    cpu_offload: bool = False
    """FSDP2 CPU offload: the policy's (and the reference's) parameters, gradients and AdamW state stay in host
    memory between uses and each block is copied to the device for its forward and backward; the optimizer steps
    on the CPU. Saves device memory on GPUs; a single CPU process (no FSDP) already keeps everything in host
    memory, so there it changes nothing (docs/guides/performance-memory.md)."""

    def __post_init__(self) -> None:
        at_least(
            self, 1, "train_global_batch_size", "train_micro_batch_size", "logprob_batch_size", "logprob_chunk_size"
        )
        budget = self.max_tokens_per_microbatch
        require(budget is None or budget >= 1, "max_tokens_per_microbatch", f"must be >= 1 or null, got {budget}")
        require(self.max_grad_norm > 0.0, "max_grad_norm", "must be > 0")
