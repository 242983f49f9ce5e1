"""The typed, frozen configuration tree: one dataclass per recipe section, a docstring under every field.

Each section checks its own fields when it is built (``__post_init__``), naming the field relative to itself;
``loading`` prefixes the section's dotted path, so a recipe's error names the full key. Rules that span sections
are ``checks``'. Schedules with ``total_steps: null`` get their stage's length when the Config is built
(``Config.__post_init__``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from dtppo.config.reward_spec import LATE_CHUNKS_NAME, MODEL_NAME, parse_spec


class ConfigError(ValueError):
    """A recipe or override is invalid; the message names the dotted key."""


def require(ok: bool, key: str, problem: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {problem}")


def _at_least(section: Any, minimum: int, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        require(value >= minimum, name, f"must be >= {minimum}, got {value}")


def _names_a_directory(section: Any, name: str) -> None:
    require(getattr(section, name).strip() != "", name, "must name a directory, got an empty string")


# Each task's verifier: its default reward function and the source of validation/accuracy (custom has none).
TASK_VERIFIERS: dict[str, str | None] = {"tiny_math": "gsm8k", "gsm8k": "gsm8k", "math": "math", "custom": None}

# ---------------------------------------------------------------------------------------------- schema


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
        _at_least(
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
    val_greedy: bool = True
    """Validation decodes greedily."""
    backend: Literal["torch", "vllm"] = "torch"
    """Who samples rollouts and validation answers: ``torch`` (dtppo's KV-cache sampler on the rank's replica)
    or ``vllm`` (one in-process vLLM engine per policy rank, refit in place after each update; needs vLLM
    installed: ``make venv`` puts the CPU build in .venv, README names the GPU wheel)."""
    vllm_kv_cache_mib: int = 256
    """KV-cache memory of each rank's vLLM engine, in MiB (vLLM's ``kv_cache_memory_bytes``)."""
    decoder: Literal["auto", "hf", "static"] = "auto"
    """torch backend: what computes the next-token logits. ``static``: dtppo's static-KV decoder (preallocated
    cache, q/k/v and gate/up stacked, a dozen kernels per layer per token), for plain Qwen2/Llama decoders only;
    ``hf``: the model's own forward with its cache, any architecture; ``auto``: static where it applies, else hf.
    The choice is printed at start."""
    decode_graph: bool = False
    """torch backend: run each decode step as one compiled graph (``torch.compile``, mode ``reduce-overhead``: on
    GPUs a CUDA graph replayed per token, so a step costs one launch instead of hundreds; on CPU inductor's
    fused kernels). The same tokens and log-probs as eager decoding up to rounding (a near-tie between two tokens
    may break the other way). Needs the static decoder; the first rollout of each batch shape compiles (tens of
    seconds)."""

    def __post_init__(self) -> None:
        _at_least(self, 1, "max_new_tokens")
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
    """How a model's pool of ranks is split: data-parallel (FSDP/HSDP) × tensor-parallel."""

    tp: int = 1
    """Tensor-parallel ranks per model replica; divides the pool's ranks."""
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
    train_global_batch_size: int = 32
    """Samples per optimizer step (a minibatch); divides the samples per step and the data-parallel ranks."""
    train_micro_batch_size: int = 32
    """Most samples per forward/backward on one rank: clamped to the rank's share of the global batch (so any
    rank count works); must divide that share when smaller (``Config.micro_batch_size``)."""
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
    (docs/performance.md)."""
    cpu_offload: bool = False
    """FSDP2 CPU offload: the policy's (and the reference's) parameters, gradients and AdamW state stay in host
    memory between uses and each block is copied to the device for its forward and backward; the optimizer steps
    on the CPU. Saves device memory on GPUs; a single CPU process (no FSDP) already keeps everything in host
    memory, so there it changes nothing (docs/performance.md)."""

    def __post_init__(self) -> None:
        _at_least(
            self, 1, "train_global_batch_size", "train_micro_batch_size", "logprob_batch_size", "logprob_chunk_size"
        )
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
    train_global_batch_size: int = 32
    """As ``policy.train_global_batch_size``."""
    train_micro_batch_size: int = 32
    """As ``policy.train_micro_batch_size``."""
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

    def __post_init__(self) -> None:
        _at_least(self, 1, "train_global_batch_size", "train_micro_batch_size", "inference_batch_size")
        require(self.max_grad_norm > 0.0, "max_grad_norm", "must be > 0")
        require(0.0 <= self.head_init_std < math.inf, "head_init_std", "must be finite and >= 0")


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
    """Validate before the first step."""
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

    def __post_init__(self) -> None:
        _at_least(
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

    def __post_init__(self) -> None:
        require(0.0 <= self.ratio_clip_low < 1.0, "ratio_clip_low", "must be in [0, 1)")
        require(self.ratio_clip_high >= 0.0, "ratio_clip_high", "must be >= 0")
        require(self.ratio_clip_c is None or self.ratio_clip_c > 1.0, "ratio_clip_c", "must be > 1 or null")
        require(self.kl_coef >= 0.0, "kl_coef", "must be >= 0")
        require(self.value_clip is None or self.value_clip > 0.0, "value_clip", "must be > 0 or null")
        require(self.value_loss_scale > 0.0, "value_loss_scale", "must be > 0")
        require(self.rollout_is_cap >= 1.0, "rollout_is_cap", f"must be >= 1, got {self.rollout_is_cap}")


@dataclass(frozen=True, kw_only=True)
class TinyMathConfig:
    """The synthetic arithmetic word problems."""

    max_number: int = 20
    """Operands and start values are drawn from 1..max_number."""
    min_ops: int = 1
    """Fewest operations per problem."""
    max_ops: int = 2
    """Most operations per problem."""
    hard_fraction: float = 0.0
    """Share of problems whose numbers come from 1..hard_max_number instead: a second difficulty that the prompt
    shows (its numbers' size), for a task whose return a critic can partly predict from the prompt."""
    hard_max_number: int = 999
    """Largest number of a hard problem (only with hard_fraction > 0)."""
    validation_seed: int = 12345
    """The held-out set; its questions never appear in training."""

    def __post_init__(self) -> None:
        require(self.max_number >= 2, "max_number", "must be >= 2")
        require(
            1 <= self.min_ops <= self.max_ops,
            "min_ops",
            "must satisfy 1 <= data.tiny_math.min_ops <= data.tiny_math.max_ops",
        )
        require(0.0 <= self.hard_fraction <= 1.0, "hard_fraction", "must be in [0, 1]")
        require(
            self.hard_fraction == 0 or self.hard_max_number > self.max_number,
            "hard_max_number",
            "must be > data.tiny_math.max_number when data.tiny_math.hard_fraction > 0",
        )


@dataclass(frozen=True, kw_only=True)
class DatasetConfig:
    """One split of a file-backed task."""

    path: str | None = None
    """A jsonl file, a ``save_to_disk`` directory or a hub dataset id (train: the training rows; validation: the
    first ``ppo.max_val_samples`` usable rows)."""
    hf_config: str | None = None
    """The configuration (subset) of a hub dataset id in ``path``, e.g. ``main`` for ``openai/gsm8k``; only
    for hub ids."""
    split: str | None = None
    """The split to read from an HF dataset: required for a hub id and for a ``save_to_disk`` directory that
    holds several splits (a DatasetDict); not for a jsonl file."""


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """The task, its files and the prompt format."""

    task: Literal["tiny_math", "gsm8k", "math", "custom"] = "tiny_math"
    """tiny_math (synthetic) | gsm8k (``question``/``answer`` rows, ``####`` answers) | math (``problem``/``solution``
    rows, the last ``\\boxed{}`` of the solution is the reference) | custom (``prompt_key``/``answer_key`` below).
    Each task's verifier is its default reward (``reward.functions``); custom has none."""
    train: DatasetConfig = field(default_factory=DatasetConfig)
    """The training rows."""
    validation: DatasetConfig = field(default_factory=DatasetConfig)
    """The held-out rows."""
    prompt_key: str = "prompt"
    """custom: the prompt column, plain text or a list of chat messages (``[{"role": ..., "content": ...}]``)."""
    answer_key: str | None = None
    """custom: the reference column (passed to reward functions as ``answer=``); null = none."""
    tiny_math: TinyMathConfig = field(default_factory=TinyMathConfig)
    """The synthetic task's generator."""
    system_prompt: str | None = None
    """Prepended as the system turn (to a message list only if it has no system turn); null = none."""
    max_prompt_tokens: int = 256
    """Rows with a longer prompt are bad rows (below); tiny_math prompts keep their last tokens."""
    on_bad_row: Literal["skip", "error"] = "skip"
    """Rows with a missing or malformed prompt or reference (for gsm8k: an empty or non-numeric answer; for math: a
    solution without ``\\boxed{}``), or a prompt over max_prompt_tokens: skip (counted, logged) | error (the
    file:line or dataset row named)."""

    def __post_init__(self) -> None:
        _at_least(self, 1, "max_prompt_tokens")
        if self.task != "tiny_math":
            for name, dataset in [("train", self.train), ("validation", self.validation)]:
                require(dataset.path is not None, f"{name}.path", f"required when data.task is {self.task}")
        if self.task == "custom":
            require(self.prompt_key.strip() != "", "prompt_key", "must name the prompt column")
            require(
                self.answer_key is None or self.answer_key.strip() != "",
                "answer_key",
                "must name the reference column, or be null",
            )


@dataclass(frozen=True, kw_only=True)
class CarelessStageConfig:
    """An optional planted flaw after SFT (tiny_math only): bare wrong "#### N" answers."""

    num_steps: int = 0
    """Optimizer steps of the stage; 0 = no stage."""
    lr: float = 3e-4
    """Its constant learning rate."""
    careless_fraction: float = 0.6
    """Fraction of its examples that are bare wrong answers."""

    def __post_init__(self) -> None:
        require(self.num_steps >= 0, "num_steps", f"must be >= 0, got {self.num_steps}")
        require(0.0 < self.lr < math.inf, "lr", f"must be finite and > 0, got {self.lr}")
        require(0.0 <= self.careless_fraction <= 1.0, "careless_fraction", "must be in [0, 1]")


@dataclass(frozen=True, kw_only=True)
class SFTConfig:
    """Supervised fine-tuning: the checkpoint PPO starts from."""

    output_dir: str = "runs/sft"
    """An HF directory (model + tokenizer), with ``sft_results.json`` (its accuracies) beside the weights."""
    seed: int = 0
    """Seeds the model's initialisation and the data order. Independent of ``ppo.seed``, so PPO seeds can share one
    SFT model and SFT models can be varied on their own (docs/learning.md)."""
    num_steps: int = 500
    """Optimizer steps of the main stage: the cap when ``patience`` stops it earlier."""
    val_period: int = 0
    """Greedy validation accuracy every N steps of the main stage (and always at its end); 0 = at its end only."""
    patience: int = 0
    """Stop the main stage once this many validations in a row improved on the best by less than
    ``min_improvement`` (its plateau), counted once the best has reached ``min_accuracy``; 0 = always train
    ``num_steps``. Needs ``val_period``."""
    min_improvement: float = 0.01
    """The accuracy gain over the best so far that counts as an improvement for ``patience``."""
    min_accuracy: float = 0.0
    """The floor: a main stage that ends below this greedy validation accuracy stops the run (exit 5) before PPO
    starts from it, both when SFT runs and when ``dtppo ppo`` reuses ``output_dir``."""
    batch_size: int = 32
    """Examples per optimizer step."""
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=3e-3))
    """SFT's AdamW."""
    scheduler: SchedulerConfig = field(default_factory=lambda: SchedulerConfig(kind="cosine", warmup_steps=30))
    """SFT's learning-rate schedule (total_steps null = ``num_steps``)."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global L2 norm."""
    careless_stage: CarelessStageConfig = field(default_factory=CarelessStageConfig)
    """The planted flaw, trained after the main stage."""
    log_period: int = 50
    """Log every N steps (and the last)."""

    def __post_init__(self) -> None:
        _at_least(self, 1, "batch_size", "log_period")
        _at_least(self, 0, "num_steps", "val_period", "patience")
        require(self.patience == 0 or self.val_period > 0, "patience", "needs sft.val_period > 0")
        require(0.0 <= self.min_improvement <= 1.0, "min_improvement", "must be in [0, 1]")
        require(0.0 <= self.min_accuracy <= 1.0, "min_accuracy", "must be in [0, 1]")
        require(self.max_grad_norm > 0.0, "max_grad_norm", "must be > 0")
        _names_a_directory(self, "output_dir")


@dataclass(frozen=True, kw_only=True)
class RewardModelConfig:
    """A learned reward model: an HF sequence-classification directory (num_labels=1, safetensors only) with its
    own tokenizer and chat template. It is never trained."""

    path: str | None = None
    """The RM's directory; null = no reward model."""
    weight: float = 1.0
    """Its score's weight in the total reward (0: scored and logged as ``train/reward/model``, not rewarded)."""
    batch_size: int = 16
    """Conversations per RM forward pass."""
    max_length: int = 1024
    """Longest rendered conversation in RM tokens; a longer one keeps its last ``max_length`` tokens."""

    def __post_init__(self) -> None:
        _at_least(self, 1, "batch_size", "max_length")
        require(math.isfinite(self.weight), "weight", "must be a finite number")


@dataclass(frozen=True, kw_only=True)
class RewardConfig:
    """The reward: weighted reward functions (TRL's signature) plus an optional learned reward model."""

    functions: tuple[str, ...] | None = None
    """Each a built-in (``gsm8k``, ``math``), ``path/to/file.py:name`` or ``package.module:name``, called as
    ``fn(prompts=..., completions=..., **columns) -> list[float | None]``; null = the task's verifier (``gsm8k`` for
    tiny_math and gsm8k, ``math`` for math; none for custom), filled in when the Config is built."""
    weights: tuple[float, ...] | None = None
    """One weight per function; null = 1 each."""
    accuracy_from: str | None = None
    """The function (by its metric name) whose validation mean is ``validation/accuracy``; null = the task's
    verifier (none for custom)."""
    model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """A learned reward model whose score joins the functions' sum."""
    num_workers: int = 2
    """Scoring processes (local run) or Ray actors (Ray run); 0 = in rank 0's process."""
    timeout_s: float = 30.0
    """A chunk not scored by then gets 0.0 instead of stalling the step."""

    def __post_init__(self) -> None:
        """The functions given parse and have unique metric names; what ``Config`` fills in from data.task (the
        default functions, one weight each, the accuracy source) is checked with it (``checks``)."""
        names = []
        for i, spec in enumerate(self.functions or ()):
            try:
                names.append(parse_spec(spec).name)
            except ValueError as err:
                raise ConfigError(f"functions[{i}]: {err}") from None
        for i, name in enumerate(names):
            require(
                name not in (MODEL_NAME, LATE_CHUNKS_NAME),
                f"functions[{i}]",
                f"{name!r} is a metric name "
                f"dtppo logs itself (train/reward/{name}: the reward model's, the late-chunk count): rename "
                f"the function",
            )
            require(
                name not in names[:i],
                f"functions[{i}]",
                f"a second function named {name!r}: metric names (train/reward/<name>) must be unique",
            )
        require(all(math.isfinite(w) for w in self.weights or ()), "weights", "must be finite numbers")
        require(self.num_workers >= 0, "num_workers", "must be >= 0")
        require(0 < self.timeout_s < math.inf, "timeout_s", "must be a finite number of seconds > 0")


@dataclass(frozen=True, kw_only=True)
class WandbConfig:
    """Weights & Biases logging of the PPO run's metrics."""

    enabled: bool = False
    """Send the PPO run's metrics.jsonl records (same names and steps) to Weights & Biases from rank 0; needs
    ``pip install 'dtppo[wandb]'``. A resumed run continues the W&B run whose id the checkpoint holds."""
    project: str = "dtppo"
    """The W&B project the run is created in."""
    entity: str | None = None
    """The W&B team or user; null: the account's default entity."""
    run_name: str | None = None
    """The run's display name; null: W&B picks one."""
    mode: Literal["online", "offline"] = "online"
    """online: stream to the W&B server; offline: write the run under ``<log_dir>/wandb`` only (upload it
    later with ``wandb sync``)."""

    def __post_init__(self) -> None:
        require(self.project.strip() != "", "project", "must not be empty")


@dataclass(frozen=True, kw_only=True)
class MlflowConfig:
    """MLflow logging of the PPO run's metrics."""

    enabled: bool = False
    """Send the PPO run's metrics.jsonl records (same names and steps) to MLflow from rank 0; needs
    ``pip install 'dtppo[mlflow]'``. A resumed run continues the MLflow run whose id the checkpoint holds."""
    tracking_uri: str | None = None
    """Where runs are stored: a tracking server (``http://host:5000``), a database (``sqlite:///mlflow.db``,
    needs the full ``mlflow`` package) or a directory (``file:/path``, which MLflow 3 opens only with
    ``MLFLOW_ALLOW_FILE_STORE=true``); null: MLflow's own choice (``MLFLOW_TRACKING_URI``, else its default)."""
    experiment: str = "dtppo"
    """The MLflow experiment the run is created in (created if missing)."""
    run_name: str | None = None
    """The run's name; null: MLflow picks one."""

    def __post_init__(self) -> None:
        require(self.experiment.strip() != "", "experiment", "must not be empty")
        require(self.tracking_uri is None or self.tracking_uri.strip() != "", "tracking_uri", "must not be empty")


@dataclass(frozen=True, kw_only=True)
class LoggerConfig:
    """Metrics output."""

    log_dir: str = "runs/ppo"
    """metrics.jsonl and TensorBoard events."""
    tensorboard: bool = True
    """Write TensorBoard events too."""
    progress: bool = True
    """One console line per step with ETA."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases logging (off by default)."""
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    """MLflow logging (off by default)."""

    def __post_init__(self) -> None:
        _names_a_directory(self, "log_dir")


@dataclass(frozen=True, kw_only=True)
class CheckpointingConfig:
    """Periodic checkpoints; a run resumes from the latest complete one."""

    enabled: bool = True
    """Save and resume."""
    checkpoint_dir: str = "runs/ppo/checkpoints"
    """Holds step_N directories."""
    save_period: int = 10
    """Save every N steps (and at the last step)."""
    keep_last: int = 2
    """Older complete checkpoints are deleted."""

    def __post_init__(self) -> None:
        _at_least(self, 1, "save_period", "keep_last")
        _names_a_directory(self, "checkpoint_dir")


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """Where the ranks run and how policy and critic share them."""

    num_nodes: int = 1
    """nodes x workers_per_node = ranks; each model's dp = its ranks / its parallel.tp."""
    workers_per_node: int = 1
    """> 1: `dtppo ppo` starts the ranks itself (or run it under torchrun)."""
    backend: Literal["local", "ray"] = "local"
    """local (this machine: spawned ranks / torchrun) | ray (one Ray actor per rank)."""
    ray_address: str | None = None
    """Attach to this Ray cluster (or $RAY_ADDRESS); null = start a private local one."""
    ray_placement: Literal["pack", "spread"] = "pack"
    """pack | spread: placement-group strategy for the rank bundles."""
    ray_temp_dir: str = "/tmp/dtppo-ray"
    """Ray session files of a private local instance (short: Ray's socket paths)."""
    ray_timeout_s: float = 120.0
    """Waiting for resources and actors before giving up."""
    policy_ranks: int = 0
    """0: policy and critic colocated on every rank. N: policy on ranks [0, N), critic on the other ranks,
    so the two updates run at the same time on different devices."""

    def __post_init__(self) -> None:
        _at_least(self, 1, "num_nodes", "workers_per_node")
        require(self.ray_timeout_s > 0, "ray_timeout_s", "must be > 0")
        require(
            self.colocated or 0 < self.policy_ranks < self.world_size,
            "policy_ranks",
            f"must be 0 (colocated) or leave the critic at least one of the {self.world_size} ranks, got "
            f"{self.policy_ranks}",
        )

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.workers_per_node

    @property
    def colocated(self) -> bool:
        return self.policy_ranks == 0

    def pool(self, role: Literal["policy", "value"]) -> range:
        """The ranks that hold ``role``'s model."""
        if self.colocated:
            return range(self.world_size)
        return range(self.policy_ranks) if role == "policy" else range(self.policy_ranks, self.world_size)


@dataclass(frozen=True, kw_only=True)
class Config:
    """A whole run. Schedules with ``total_steps: null`` get their stage's length here, once (cleanrl's
    "filled in at runtime" values): the built Config holds numbers, never null, for them."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """The actor."""
    value: ValueConfig = field(default_factory=ValueConfig)
    """The critic."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """The PPO loop."""
    loss: LossConfig = field(default_factory=LossConfig)
    """The losses."""
    data: DataConfig = field(default_factory=DataConfig)
    """The task and its prompts."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised fine-tuning before PPO."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Scoring."""
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    """Metrics output."""
    checkpointing: CheckpointingConfig = field(default_factory=CheckpointingConfig)
    """Checkpoints and resume."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Ranks and their placement."""

    def __post_init__(self) -> None:
        # A frozen dataclass fills derived fields through object.__setattr__ (the documented way).
        reward, verifier = self.reward, TASK_VERIFIERS[self.data.task]
        functions = reward.functions if reward.functions is not None else tuple(v for v in [verifier] if v)
        object.__setattr__(
            self,
            "reward",
            dataclasses.replace(
                reward,
                functions=functions,
                weights=reward.weights if reward.weights is not None else (1.0,) * len(functions),
                accuracy_from=reward.accuracy_from if reward.accuracy_from is not None else verifier,
            ),
        )
        for name, length in [
            ("sft", self.sft.num_steps),
            ("policy", self.optimizer_steps("policy")),
            ("value", self.optimizer_steps("value")),
        ]:
            section = getattr(self, name)
            if section.scheduler.total_steps is None:
                scheduler = dataclasses.replace(section.scheduler, total_steps=length)
                object.__setattr__(self, name, dataclasses.replace(section, scheduler=scheduler))

    def optimizer_steps(self, role: Literal["policy", "value"]) -> int:
        """Optimizer steps a PPO run makes on ``role``'s model: one per global batch of each epoch of each
        step (the policy's only from ``ppo.policy_training_start_step`` on)."""
        ppo, batch = self.ppo, getattr(self, role).train_global_batch_size
        steps = ppo.max_num_steps - (ppo.policy_training_start_step if role == "policy" else 0)
        return max(steps, 0) * ppo.ppo_epochs * (self.samples_per_step // batch)

    @property
    def has_critic(self) -> bool:
        """Whether the run trains a value model: ``ppo.advantage_estimator=gae`` (GRPO needs none)."""
        return self.ppo.advantage_estimator == "gae"

    @property
    def samples_per_step(self) -> int:
        return self.ppo.num_prompts_per_step * self.ppo.num_generations_per_prompt

    @property
    def policy_init_path(self) -> str | None:
        """Where the policy's weights come from: the SFT output when PPO starts from SFT."""
        return self.sft.output_dir if self.ppo.init_from_sft else self.policy.model.path

    @property
    def value_init_path(self) -> str | None:
        """The critic's backbone: its own path if set, else the policy's starting point (or a tiny random model)."""
        return self.value.model.path or self.policy_init_path

    def data_parallel_size(self, role: Literal["policy", "value"]) -> int:
        """Data-parallel ranks of ``role``'s pool: its ranks / its ``parallel.tp``."""
        return len(self.cluster.pool(role)) // getattr(self, role).parallel.tp

    def micro_batch_size(self, role: Literal["policy", "value"]) -> int:
        """Samples per forward/backward on one rank: ``train_micro_batch_size`` is an upper bound, clamped to a
        rank's share of the global batch, so one recipe runs at any rank count. This is the size the engine's
        microbatch loop runs, which never takes more rows than the rank holds."""
        section = getattr(self, role)
        return min(
            section.train_micro_batch_size, section.train_global_batch_size // max(self.data_parallel_size(role), 1)
        )

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(dataclasses.asdict(self))


def _to_plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_to_plain(v) for v in value]
    return value
