"""A PPO step's metrics (docs/guides/metrics.md), assembled once its phases have run: the samples, the mismatch between
generator and trainer, the advantages, the staleness, the episodes, the critic's fit and updates, the policy's
updates, and the phases' timings. Values stay tensors until the trainer's one ``to_floats`` per step."""

from __future__ import annotations

import torch

from dtppo.algorithms.advantages import first_token_abs_mean, outcome_returns
from dtppo.algorithms.kl import kl_estimate
from dtppo.algorithms.losses import explained_var
from dtppo.algorithms.mismatch import mismatch_sample_mask, rollout_is_stats, seq_mult_prob_error
from dtppo.config import Config
from dtppo.observability.metrics import mean_over
from dtppo.observability.timing import PhaseTimer
from dtppo.ops import masked_max, masked_mean, masked_min
from dtppo.ppo.rollouts import Rollout, ScoredBatch
from dtppo.ppo.sample_filters import overlong_penalties
from dtppo.types import EPISODE_ENDS, Experience


def train_metrics(
    cfg: Config,
    batch: ScoredBatch,
    experience: Experience,
    runs: dict[str, list[dict]],
    fit: dict[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """``train/*`` of a step that trained: ``batch`` as scored (its rows' ``sample_mask`` marks the samples whose
    reward is known), ``experience`` the rows as trained (filters, advantages), ``runs`` each update phase's
    statistics per pass (``PPOLoop._update``), ``fit`` the critic's fit before its update (empty without one)."""
    metrics = rollout_metrics(cfg, experience, batch.rollout.experience.sample_mask)
    metrics |= staleness_metrics(batch.rollout) | episode_metrics(experience)
    metrics |= {f"train/reward/{name}": torch.tensor(mean) for name, mean in batch.reward_means.items()}
    metrics |= {name: torch.tensor(value) for name, value in batch.selection.items()}
    if runs.get("policy_update"):
        metrics |= {f"train/{k}": v for k, v in mean_over(runs["policy_update"]).items()}
    if "critic_update" in runs:
        metrics |= critic_metrics(cfg, experience, runs["critic_update"], fit)
    return metrics


def rollout_metrics(cfg: Config, experience: Experience, scored: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Metrics of the samples themselves (all of them; the reward over those ``scored``, [B] 0 / 1, None = all),
    of the mismatch, and of the advantages (those that train)."""
    mask, trained = experience.response_mask, experience.train_mask
    seq_error = seq_mult_prob_error(experience.gen_logprobs, experience.old_logprobs, mask)
    behaviour_ratio = torch.exp(experience.old_logprobs - experience.gen_logprobs)
    returns = experience.total_rewards
    metrics = {
        "train/reward": returns.mean() if scored is None else masked_mean(returns, scored),
        "train/advantages/mean": masked_mean(experience.advantages, trained),
        "train/advantages/min": masked_min(experience.advantages, trained),
        "train/advantages/max": masked_max(experience.advantages, trained),
        "train/advantages/first_token_abs_mean": first_token_abs_mean(experience.advantages, trained),
        "train/token_mult_prob_error": masked_mean(
            torch.exp((experience.gen_logprobs - experience.old_logprobs).abs()), mask
        ),
        # π_old/π_gen: the behaviour policy against the one trained (max_lag steps newer, or the same weights)
        "train/behaviour_ratio/mean": masked_mean(behaviour_ratio, trained),
        "train/behaviour_ratio/min": masked_min(behaviour_ratio, trained),
        "train/behaviour_ratio/max": masked_max(behaviour_ratio, trained),
        "train/seq_mult_prob_error/mean": seq_error.mean(),
        "train/seq_mult_prob_error/max": seq_error.max(),
        "train/mean_gen_tokens_per_sample": mask.sum(-1).mean(),
        "train/truncation_rate": experience.truncated.float().mean(),
    }
    return metrics | _filter_metrics(cfg, experience, seq_error)


def _filter_metrics(cfg: Config, experience: Experience, seq_error: torch.Tensor) -> dict[str, torch.Tensor]:
    """The sample filters' and the reference's figures, each where its option is on. seq_error: [B]."""
    metrics = {}
    threshold = cfg.loss.rollout_correction.seq_logprob_error_threshold
    if threshold is not None:
        metrics["train/num_masked_seqs_by_logprob_error"] = (mismatch_sample_mask(seq_error, threshold) == 0).sum()
    if cfg.ppo.overlong_filtering:
        metrics["train/overlong/filtered_samples"] = experience.truncated.sum()
    if cfg.ppo.overlong_shaping.enabled:
        penalty = overlong_penalties(experience, cfg)
        metrics["train/overlong/shaped_samples"] = (penalty < 0).sum()
        metrics["train/overlong/penalty_mean"] = penalty.mean()
    if experience.is_weights is not None:
        stats = rollout_is_stats(
            experience.is_weights, experience.train_mask, cfg.loss.rollout_correction.importance_sampling_cap
        )
        metrics |= {f"train/rollout_is/{name}": value for name, value in stats.items()}
    if experience.ref_logprobs is not None:
        kl = kl_estimate(cfg.loss.kl.estimator, experience.old_logprobs, experience.ref_logprobs)
        metrics["train/kl_penalty"] = masked_mean(kl, experience.response_mask)
    return metrics


def staleness_metrics(rollout: Rollout) -> dict[str, torch.Tensor]:
    """Steps between the policy that sampled the batch and the one it trains (the same for every sample: a
    batch is never sampled across a weight change), and the generation ranks' timings when they sampled it."""
    staleness = torch.tensor(float(rollout.staleness))
    metrics = {"train/staleness/mean": staleness, "train/staleness/max": staleness}
    return metrics | {name: torch.tensor(value) for name, value in rollout.metrics.items()}


def critic_metrics(
    cfg: Config, experience: Experience, critic_runs: list[dict], fit: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The critic's predictions before its update (``fit``: ``critic_warmup.critic_fit``'s), and its update
    statistics (``train/critic/*``), over the samples that train."""
    mask = experience.train_mask
    metrics = {
        "values_mean": masked_mean(experience.old_values, mask),
        "values_min": masked_min(experience.old_values, mask),
        "values_max": masked_max(experience.old_values, mask),
        "returns_mean": masked_mean(experience.returns, mask),
        **fit,
        # against what the responses actually got, whatever the targets (V-trace's bootstrap toward V)
        "explained_var_outcome": explained_var(
            outcome_returns(experience.rewards, mask, cfg.ppo.gae.gamma), experience.old_values, mask
        ),
        **mean_over(critic_runs),
    }
    return {f"train/critic/{k}": v for k, v in metrics.items()}


def episode_metrics(experience: Experience) -> dict[str, torch.Tensor]:
    """Multi-turn episodes' figures (``train/episodes/*``), means per episode: assistant turns, tool calls (turns
    the environment answered with a non-empty observation), observation tokens, the environment's reward, and the
    share of episodes that ended each way (``types.EPISODE_ENDS``). Empty for single-turn rollouts."""
    if experience.turn_ids is None:
        return {}
    in_episode = experience.attention_mask.bool() & (experience.turn_ids > 0)
    observation = in_episode & ~experience.response_mask.bool()
    turns = experience.turn_ids.max(-1).values.float()
    metrics = {
        "train/episodes/turns": turns.mean(),
        "train/episodes/tool_calls": _observation_runs(observation).float().mean(),
        "train/episodes/observation_tokens": observation.sum(-1).float().mean(),
        "train/reward/env": experience.step_rewards.sum(-1).mean(),
    }
    for code, end in enumerate(EPISODE_ENDS):
        metrics[f"train/episodes/ended_by/{end}"] = (experience.episode_end == code).float().mean()
    return metrics


def _observation_runs(observation: torch.Tensor) -> torch.Tensor:
    """[B] the number of contiguous runs of True in each row of ``observation`` [B, T] (one per observation)."""
    previous = torch.cat([torch.zeros_like(observation[:, :1]), observation[:, :-1]], dim=1)
    return (observation & ~previous).sum(-1)


def timing_metrics(timer: PhaseTimer, experience: Experience | None, step_seconds: float) -> dict[str, torch.Tensor]:
    """``timing/<phase>`` and ``timing/step`` seconds; for a step that trained (``experience``), its tokens per
    second and, on a GPU, the most memory this process has held on it so far."""
    metrics = {}
    if experience is not None:
        metrics["perf/tokens_per_sec"] = experience.attention_mask.sum() / step_seconds
        if torch.cuda.is_available():
            metrics["perf/max_memory_allocated_gib"] = torch.tensor(torch.cuda.max_memory_allocated() / 2**30)
    metrics |= {f"timing/{phase}": torch.tensor(seconds) for phase, seconds in timer.seconds.items()}
    return metrics | {"timing/step": torch.tensor(step_seconds)}
