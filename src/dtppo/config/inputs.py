"""The sections that say what a run reads and how it scores: the task and its data, SFT before PPO, the rewards,
the environment of multi-turn episodes. Each checks its own fields (``__post_init__``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from dtppo.config.optim import OptimizerConfig, SchedulerConfig
from dtppo.config.reward import check_process_bounds
from dtppo.config.reward_spec import parse_spec
from dtppo.config.rules import ConfigError, at_least, names_a_directory, require

# Each task's verifier: its default reward function and the source of validation/accuracy (custom has none).
TASK_VERIFIERS: dict[str, str | None] = {"tiny_math": "gsm8k", "gsm8k": "gsm8k", "math": "math", "custom": None}


@dataclass(frozen=True, kw_only=True)
class TinyMathConfig:
    """The synthetic arithmetic problems."""

    kind: Literal["word_problems", "running_sum"] = "word_problems"
    """word_problems: 1-2 step stories ("Tom has 5 apples. He buys 3 more, ...") answered by one equation per step;
    running_sum: "Start at s. Add k until the total is over t." answered by every running total compared with t, one
    ``a+k=b<=t`` line per addition and a last ``a+k=b>t`` (min_ops..max_ops lines: long responses;
    docs/guides/learning.md, "A long task")."""
    max_number: int = 20
    """Operands and start values are drawn from 1..max_number (running_sum: s and k)."""
    min_ops: int = 1
    """Fewest operations per problem (running_sum: additions)."""
    max_ops: int = 2
    """Most operations per problem (running_sum: additions)."""
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
            self.kind == "word_problems" or self.hard_fraction == 0,
            "hard_fraction",
            "applies to word_problems only (data.tiny_math.kind)",
        )
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
    first ``ppo.validation.max_samples`` usable rows)."""
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
    chat_template_kwargs: tuple[tuple[str, Any], ...] = ()
    """Variables of the policy's chat template, given to every rendering of it (prompts, SFT rows, validation,
    the observation turns of episodes, preflight's check), e.g. ``{enable_thinking: false}`` for Qwen3: a mapping of
    names to strings, numbers, booleans or null. A name that changes nothing the template renders (one it does not
    read, or reads only after setting it itself) is refused at start."""
    max_prompt_tokens: int = 256
    """Rows with a longer prompt are bad rows (below); tiny_math prompts keep their last tokens."""
    on_bad_row: Literal["skip", "error"] = "skip"
    """Rows with a missing or malformed prompt or reference (for gsm8k: an empty or non-numeric answer; for math: a
    solution without ``\\boxed{}``), or a prompt over max_prompt_tokens: skip (counted, logged) | error (the
    file:line or dataset row named)."""

    def __post_init__(self) -> None:
        at_least(self, 1, "max_prompt_tokens")
        _check_template_kwargs(self.chat_template_kwargs)
        if self.task == "custom":
            require(self.prompt_key.strip() != "", "prompt_key", "must name the prompt column")
            require(
                self.answer_key is None or self.answer_key.strip() != "",
                "answer_key",
                "must name the reference column, or be null",
            )


# What apply_chat_template and its template already take from dtppo or the tokenizer on every rendering.
TEMPLATE_OWN_NAMES = frozenset(
    {"conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt"}
    | {"continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict"}
    | {"return_assistant_tokens_mask", "tokenizer_kwargs", "bos_token", "eos_token", "unk_token", "sep_token"}
    | {"pad_token", "cls_token", "mask_token", "additional_special_tokens"}
)


def _check_template_kwargs(pairs: Any) -> None:
    """``data.chat_template_kwargs``: (name, JSON scalar) pairs, none of them a name dtppo or transformers sets."""
    key = "chat_template_kwargs"
    require(
        isinstance(pairs, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in pairs),
        key,
        f"expected a mapping of names to values, got {pairs!r}",
    )
    for name, value in pairs:
        require(isinstance(name, str) and name.isidentifier(), key, f"{name!r} is not a template variable name")
        finite = isinstance(value, float) and math.isfinite(value)
        scalar = value is None or isinstance(value, (str, bool, int)) or finite
        require(scalar, f"{key}.{name}", f"expected a string, number, boolean or null (a JSON scalar), got {value!r}")
        require(
            name not in TEMPLATE_OWN_NAMES,
            f"{key}.{name}",
            "is set on every rendering by dtppo or transformers (the messages, the generation prompt, the tokenizer's "
            "special tokens): it cannot be given here",
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
    SFT model and SFT models can be varied on their own (docs/guides/learning.md)."""
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
    """Examples per optimizer step, split evenly over the policy's data-parallel ranks (SFT trains on the policy's
    ranks, sharded as the policy is)."""
    micro_batch_size: int | None = None
    """Examples per forward/backward on one rank (gradients accumulate over a rank's share); null = the whole
    share at once."""
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
        at_least(self, 1, "batch_size", "log_period")
        at_least(self, 0, "num_steps", "val_period", "patience")
        require(self.micro_batch_size is None or self.micro_batch_size >= 1, "micro_batch_size", "must be >= 1")
        require(self.patience == 0 or self.val_period > 0, "patience", "needs sft.val_period > 0")
        require(0.0 <= self.min_improvement <= 1.0, "min_improvement", "must be in [0, 1]")
        require(0.0 <= self.min_accuracy <= 1.0, "min_accuracy", "must be in [0, 1]")
        require(self.max_grad_norm > 0.0, "max_grad_norm", "must be > 0")
        names_a_directory(self, "output_dir")


@dataclass(frozen=True, kw_only=True)
class EnvConfig:
    """A multi-turn environment (docs/guides/episodes.md): after each assistant turn it answers with an observation (a
    tool's output) that the policy reads but is never trained on, a reward, and whether the episode is done."""

    class_: str | None = None
    """The environment class (recipe key ``class``): ``path/to/file.py:Name`` or ``package.module:Name``, built once
    per environment process with ``kwargs``; it has ``reset(row) -> state`` and ``step(state, assistant_text) ->
    (observation | None, reward, done)`` (a state it changes in place is kept for the next step). null =
    single-turn episodes (one response, scored once)."""
    kwargs: tuple[tuple[str, Any], ...] = ()
    """Keyword arguments of the class (a mapping in a recipe; numbers, strings, booleans, null and lists of them)."""
    max_turns: int = 4
    """Assistant turns per episode at most; the episode ends after the last (its final observation is dropped)."""
    max_observation_tokens: int = 64
    """An observation longer than this keeps its first ``max_observation_tokens`` tokens (counted in metrics)."""
    max_total_tokens: int = 256
    """Tokens after the prompt (the policy's and the observations') per episode at most: a turn gets what is left
    of it, at most ``policy.generation.max_new_tokens``."""
    stop: tuple[str, ...] = ()
    """Strings that end an assistant turn besides the stop tokens (e.g. ``</calc>``): the turn keeps the text up to
    and including the first one, and the environment answers it."""
    num_workers: int = 2
    """Environment processes per generating rank; 0 = in the generating process (no time, memory or output bound
    then)."""
    timeout_s: float = 30.0
    """A batch of resets or steps not answered by then stops the run with one line naming the environment."""
    memory_limit_mib: int = 4096
    """Data the environment may add to what each environment process holds once started (``reward.memory_limit_mib``'s
    rule): past it, the step raises ``MemoryError`` and the run stops naming it. 0 = no limit."""
    max_print_bytes: int = 16384
    """What the environment may write to stdout and stderr per job; the rest is dropped with one notice."""

    def __post_init__(self) -> None:
        if self.class_ is not None:
            try:
                parse_spec(self.class_)
            except ValueError as err:
                raise ConfigError(f"class: {err}") from None
            require(parse_spec(self.class_).kind != "builtin", "class", "names a reward function, not a class")
        at_least(self, 1, "max_turns", "max_observation_tokens", "max_total_tokens")
        require(all(s for s in self.stop), "stop", "an empty string would end every turn at once")
        require(self.num_workers >= 0, "num_workers", "must be >= 0")
        require(0 < self.timeout_s < math.inf, "timeout_s", "must be a finite number of seconds > 0")
        check_process_bounds(self)

    @property
    def multi_turn(self) -> bool:
        return self.class_ is not None
