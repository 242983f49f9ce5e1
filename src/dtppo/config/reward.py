"""The reward's sections: the functions, the learned reward model, the process reward model, and the bounds of the
processes that run the user's code."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from dtppo.config.reward_spec import RESERVED_NAMES, parse_spec
from dtppo.config.rules import ConfigError, at_least, require

if TYPE_CHECKING:
    from dtppo.config.inputs import EnvConfig

MIN_MEMORY_LIMIT_MIB = 128  # below it, importing a user's libraries (numpy: about 30 MiB) may not fit


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
        at_least(self, 1, "batch_size", "max_length")
        require(math.isfinite(self.weight), "weight", "must be a finite number")


@dataclass(frozen=True, kw_only=True)
class ProcessModelConfig:
    """A process reward model: an HF directory (safetensors only) that scores each step of a completion, the steps
    cut at ``separator``; each step's score is a step reward on the token holding the step's last character
    (docs/guides/step-rewards.md). It is never trained."""

    path: str | None = None
    """The PRM's directory; null = no process reward model."""
    head: Literal["token_classification", "causal_lm"] = "token_classification"
    """How it scores a step: ``token_classification``, a token-classification head read at the step's last token
    (or its ``step_tag``): sigmoid of one label, or the second label's probability of two; ``causal_lm``, a causal
    LM read at each ``step_tag`` (Math-Shepherd's form): the probability of ``good_token`` against
    ``bad_token``."""
    separator: str = "\n"
    """What ends a step in a completion; blank steps score nothing."""
    step_tag: str | None = None
    """Text put after each step where the model reads it (Math-Shepherd's " ки"); null = read at the step's last
    token. Required for ``causal_lm``."""
    good_token: str | None = None
    """``causal_lm``: the token whose probability is a correct step's (Math-Shepherd's "+")."""
    bad_token: str | None = None
    """``causal_lm``: the token of a wrong step (Math-Shepherd's "-")."""
    weight: float = 1.0
    """Each step score's weight (0: scored and logged as ``train/reward/process_model``, not rewarded)."""
    batch_size: int = 8
    """Completions per PRM forward pass."""
    max_length: int = 2048
    """Longest rendered input in PRM tokens; a longer one keeps its last ``max_length``, and the steps read before
    them score nothing."""

    def __post_init__(self) -> None:
        at_least(self, 1, "batch_size", "max_length")
        require(math.isfinite(self.weight), "weight", "must be a finite number")
        require(self.separator != "", "separator", "must be a non-empty string")
        require(self.step_tag != "", "step_tag", "must be null or a non-empty string")
        if self.head == "causal_lm":
            for name in ("step_tag", "good_token", "bad_token"):
                require(getattr(self, name) is not None, name, "must be set for head causal_lm (Math-Shepherd's form)")
            require(self.good_token != self.bad_token, "bad_token", "must differ from good_token")
        else:
            for name in ("good_token", "bad_token"):
                require(getattr(self, name) is None, name, "is read by head causal_lm only: leave it null")


@dataclass(frozen=True, kw_only=True)
class RewardConfig:
    """The reward: weighted reward functions (TRL's signature), and optional learned and process reward models."""

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
    process_model: ProcessModelConfig = field(default_factory=ProcessModelConfig)
    """A process reward model whose step scores join the functions' steps."""
    num_workers: int = 2
    """Scoring processes (local run) or Ray actors (Ray run); 0 = in rank 0's process (no time, memory or output
    bound, and a crash ends the run)."""
    timeout_s: float = 30.0
    """A chunk not scored by then fails (``timed_out``) instead of stalling the step; its process is replaced."""
    memory_limit_mib: int = 4096
    """Data (heap and private memory) the functions may add to what each scoring process or Ray scoring actor holds
    once started (about 55 and 220 MiB), enforced by the kernel on Linux (``RLIMIT_DATA``): a function that
    allocates past it fails its own chunk (``out_of_memory``, or ``crashed``). 0 = no limit; at least 128
    otherwise."""
    max_print_bytes: int = 16384
    """What the functions may write to stdout and stderr per chunk (``print``, C code, subprocesses); the rest is
    dropped with one notice."""
    max_failed_fraction: float = 0.5
    """The run stops (exit 2, after checkpointing the step) when more than this fraction of the chunks scored over
    the last ``failure_window`` steps failed (crashed, timed out, raised, out of memory); 1 = never. A failed
    chunk's samples leave training (``sample_mask`` 0) instead of counting as reward 0."""
    failure_window: int = 5
    """Steps the failure fraction is taken over. Before that many steps have run, the steps not yet run count as
    chunks that succeeded at the current rate, so a function that always fails stops the run after
    ``floor(max_failed_fraction · failure_window) + 1`` steps (3 with the defaults), and with the defaults one
    flaky chunk never does; after the run's last step the steps run are all there is."""

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
                name not in RESERVED_NAMES,
                f"functions[{i}]",
                f"{name!r} is a metric name dtppo logs itself (train/reward/{name}: the reward model's score, "
                f"the failed chunks and samples): rename the function",
            )
            require(
                name not in names[:i],
                f"functions[{i}]",
                f"a second function named {name!r}: metric names (train/reward/<name>) must be unique",
            )
        require(all(math.isfinite(w) for w in self.weights or ()), "weights", "must be finite numbers")
        require(self.num_workers >= 0, "num_workers", "must be >= 0")
        require(0 < self.timeout_s < math.inf, "timeout_s", "must be a finite number of seconds > 0")
        check_process_bounds(self)
        require(0.0 <= self.max_failed_fraction <= 1.0, "max_failed_fraction", "must be in [0, 1]")
        at_least(self, 1, "failure_window")


def check_process_bounds(section: RewardConfig | EnvConfig) -> None:
    """``memory_limit_mib`` and ``max_print_bytes`` of the processes that run the user's code."""
    require(
        section.memory_limit_mib == 0 or section.memory_limit_mib >= MIN_MEMORY_LIMIT_MIB,
        "memory_limit_mib",
        f"must be 0 (no limit) or at least {MIN_MEMORY_LIMIT_MIB}",
    )
    require(section.max_print_bytes >= 0, "max_print_bytes", "must be >= 0")
