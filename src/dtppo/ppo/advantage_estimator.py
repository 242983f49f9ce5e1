"""Advantage estimators: the one choice between PPO with a critic (GAE) and GRPO, made once from the config.

Each is a callable ``Experience -> Experience`` that fills ``advantages`` (and, with a critic, ``returns``) over
the samples that train (``Experience.train_mask``), built on the pure functions of ``algorithms.advantages``.
The trainer builds one in its constructor and otherwise asks only whether it has a critic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dtppo import faults
from dtppo.algorithms.advantages import (
    VTraceCorrection,
    compute_advantages,
    group_normalized_advantages,
    length_adaptive_lambda,
    process_supervised_advantages,
    token_level_rewards,
)
from dtppo.algorithms.kl import kl_estimate
from dtppo.config import Config
from dtppo.types import Experience

Estimator = Callable[[Experience], Experience]


@dataclass(frozen=True)
class GAEEstimator:
    """Token rewards (the outcome reward at the last response token, minus ``kl_coef``·KL per token when the KL
    is in the reward), then decoupled GAE (λ for the policy, λ for the critic's returns) and whitening. With
    ``vtrace_caps`` (ρ̄, c̄), V-trace instead of GAE, each token corrected by π_old/π_gen
    (``value.target_correction``)."""

    gamma: float
    lambda_policy: float
    lambda_value: float
    normalize: bool
    length_adaptive_alpha: float
    kl_in_reward_coef: float  # 0: no KL term in the reward
    kl_estimator: str
    vtrace_caps: tuple[float, float] | None = None
    per_turn: bool = False  # ppo.gae.unit = turn: one GAE step per assistant turn of an episode

    def __call__(self, experience: Experience) -> Experience:
        """Needs ``rewards`` [B], ``old_values`` [B, T] (and ``old_logprobs``/``ref_logprobs`` [B, T] for the KL;
        ``old_logprobs``/``gen_logprobs`` for V-trace). An episode's turn rewards join the final answer's."""
        mask = experience.train_mask
        kl = None
        if self.kl_in_reward_coef > 0.0:
            kl = kl_estimate(self.kl_estimator, experience.old_logprobs, experience.ref_logprobs)
        token_rewards = token_level_rewards(experience.rewards, mask, kl, self.kl_in_reward_coef)
        if experience.step_rewards is not None:
            token_rewards = token_rewards + experience.step_rewards * mask
        fault = faults.learning_fault()
        if fault == "drop_rewards":
            token_rewards = torch.zeros_like(token_rewards)
        lambda_policy: float | torch.Tensor = self.lambda_policy
        if self.length_adaptive_alpha > 0.0:
            lambda_policy = length_adaptive_lambda(mask.sum(-1), self.length_adaptive_alpha)
        vtrace = None
        if self.vtrace_caps is not None:
            log_rho = experience.old_logprobs - experience.gen_logprobs
            vtrace = VTraceCorrection(log_rho, *self.vtrace_caps)
        advantages, returns = compute_advantages(
            token_rewards,
            experience.old_values,
            mask,
            self.gamma,
            lambda_policy,
            self.lambda_value,
            self.normalize,
            vtrace,
            experience.turn_ids if self.per_turn else None,
        )
        if fault == "zero_advantages":
            advantages = torch.zeros_like(advantages)
        return experience.replace(advantages=advantages, returns=returns)


@dataclass(frozen=True)
class GRPOEstimator:
    """Group-normalised rewards: each sample against the other samples of its prompt. Outcome only, each sample's
    reward normalised over its group; with step rewards (a reward function's steps, an episode's turns), process
    supervision: every step normalised over the group's steps, each token given the sum of its sample's
    normalised steps that end at or after it."""

    group_size: int

    def __call__(self, experience: Experience) -> Experience:
        """Needs ``rewards`` [B], B a multiple of ``group_size`` with a prompt's samples adjacent, and the step
        rewards and their mask when there are steps."""
        if experience.step_mask is not None and experience.step_mask.any():
            advantages = process_supervised_advantages(
                experience.rewards,
                experience.step_rewards,
                experience.step_mask,
                experience.train_mask,
                self.group_size,
                sample_mask=experience.sample_mask,
            )
        else:
            advantages = group_normalized_advantages(
                experience.rewards, experience.train_mask, self.group_size, sample_mask=experience.sample_mask
            )
        return experience.replace(advantages=advantages)


def build_estimator(cfg: Config) -> Estimator:
    """GAE with a critic (``ppo.advantage_estimator=gae``), GRPO without."""
    ppo, loss = cfg.ppo, cfg.loss
    if not cfg.has_critic:
        return GRPOEstimator(ppo.num_generations_per_prompt)
    kl_coef = loss.kl.coef if loss.kl.coef > 0.0 and loss.kl.in_reward else 0.0
    return GAEEstimator(
        ppo.gae.gamma,
        ppo.gae.lambda_policy,
        ppo.gae.lambda_value,
        ppo.normalize_advantages,
        ppo.gae.length_adaptive_alpha,
        kl_coef,
        loss.kl.estimator,
        (cfg.value.vtrace.rho_cap, cfg.value.vtrace.c_cap) if cfg.value.target_correction == "vtrace" else None,
        per_turn=ppo.gae.unit == "turn",
    )
