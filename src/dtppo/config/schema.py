"""The typed, frozen configuration tree: ``Config``, one dataclass field per recipe section, and its derived values.

The sections live by what they describe, one module per kind: ``models`` (weights, adapters, layouts), ``optim``,
``generation``, ``policy``, ``value``, ``ppo``, ``loss``, ``inputs`` (data, SFT, the environment), ``reward`` and
``run`` (logging, trackers, checkpoints, cluster); each has a docstring under every field and checks its own fields
when it is built (``__post_init__``), naming the field relative to itself; ``loading`` prefixes the section's dotted
path, so a recipe's error names the full key. Rules that span sections are ``checks``'. Schedules with
``total_steps: null`` get their stage's length when the Config is built (``Config.__post_init__``).
"""

from __future__ import annotations

import dataclasses
import keyword
from dataclasses import dataclass, field
from typing import Any, Literal

from dtppo.config.inputs import (
    TASK_VERIFIERS,
    DataConfig,
    EnvConfig,
    SFTConfig,
)
from dtppo.config.loss import LossConfig
from dtppo.config.models import ModelConfig
from dtppo.config.policy import PolicyConfig
from dtppo.config.ppo import PPOConfig
from dtppo.config.reward import RewardConfig
from dtppo.config.run import CheckpointingConfig, ClusterConfig, ExportConfig, LoggerConfig
from dtppo.config.value import ValueConfig


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
    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment of multi-turn episodes (none: single-turn)."""
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    """Metrics output."""
    checkpointing: CheckpointingConfig = field(default_factory=CheckpointingConfig)
    """Checkpoints and resume."""
    export: ExportConfig = field(default_factory=ExportConfig)
    """``dtppo export``'s HF directories."""
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
        # The critic's aggregation defaults to the policy's; seq-mean-token-sum-norm's constant to the longest response.
        value, loss = self.value, self.loss
        if value.loss_aggregation is None:
            object.__setattr__(self, "value", dataclasses.replace(value, loss_aggregation=loss.aggregation))
        if loss.aggregation_horizon is None:
            object.__setattr__(self, "loss", dataclasses.replace(loss, aggregation_horizon=self.response_horizon))
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
        step, ``value.updates_per_step`` times for the critic; the policy's only from
        ``value.warmup.steps`` on (a warmup that ends on the critic's EV has no known length: the
        policy's count is then the whole run's, an upper bound)."""
        ppo, batch = self.ppo, getattr(self, role).train_global_batch_size
        steps = ppo.max_num_steps - (self.value.warmup.steps if role == "policy" else 0)
        passes = ppo.ppo_epochs * (self.value.updates_per_step if role == "value" else 1)
        return max(steps, 0) * passes * (self.samples_per_step // batch)

    @property
    def has_critic(self) -> bool:
        """Whether the run trains a value model: ``ppo.advantage_estimator=gae`` (GRPO needs none)."""
        return self.ppo.advantage_estimator == "gae"

    @property
    def generation_prompt_tokens(self) -> int:
        """The longest prefix a generator samples from: a prompt, and in an episode its turns and observations."""
        return self.data.max_prompt_tokens + (self.env.max_total_tokens if self.env.multi_turn else 0)

    @property
    def response_horizon(self) -> int:
        """The most tokens after the prompt a sample holds: one response, or an episode's turns and observations."""
        return self.env.max_total_tokens if self.env.multi_turn else self.policy.generation.max_new_tokens

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

    @property
    def critic_model(self) -> ModelConfig | None:
        """The critic's starting backbone: ``value.model`` with its path resolved (``value_init_path``); None when
        the run has no critic."""
        return dataclasses.replace(self.value.model, path=self.value_init_path) if self.has_critic else None

    def data_parallel_size(self, role: Literal["policy", "value"]) -> int:
        """Data-parallel ranks of ``role``'s pool: its ranks / (its ``parallel.tp`` · its ``parallel.cp``)."""
        parallel = getattr(self, role).parallel
        return len(self.cluster.pool(role)) // (parallel.tp * parallel.cp)

    def micro_batch_size(self, role: Literal["policy", "value"]) -> int:
        """Samples per forward/backward on one rank: ``train_micro_batch_size`` is an upper bound, clamped to a
        rank's share of the global batch, so one recipe runs at any rank count. This is the size the updater's
        microbatch loop runs, which never takes more rows than the rank holds."""
        section = getattr(self, role)
        return min(
            section.train_micro_batch_size, section.train_global_batch_size // max(self.data_parallel_size(role), 1)
        )

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(dataclasses.asdict(self))


def _to_plain(value: Any) -> Any:
    if isinstance(value, dict):  # a field named for a Python keyword is written as the keyword (env.class_: class)
        return {k[:-1] if keyword.iskeyword(k[:-1]) else k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_to_plain(v) for v in value]
    return value
