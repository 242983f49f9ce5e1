"""Dynamic sampling (DAPO, Yu et al. 2025, §3.2): which prompt groups of a scored batch train, chosen once from the
config (``ppo.dynamic_sampling``), and the refill loop that scores more batches until enough groups are kept."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dtppo.algorithms.advantages import outcome_returns
from dtppo.algorithms.filtering import first_response_token, groups_with_reward_spread, groups_with_value_error
from dtppo.config import Config
from dtppo.errors import RunStopped
from dtppo.ppo.rollouts import Rollout, ScoredBatch
from dtppo.rewards.rewarder import RewardBreakdown, concat_breakdowns
from dtppo.types import Experience, concat_rows

# A scored batch: the step's own (0) or dynamic sampling's n-th more, with its rewards (None off rank 0).
ScoreBatch = Callable[[int], tuple[Rollout, RewardBreakdown | None]]


@dataclass(frozen=True)
class GroupFilter:
    """The criterion ``ppo.dynamic_sampling.criterion`` over groups of ``group_size`` adjacent samples."""

    criterion: str
    group_size: int
    min_value_error: float
    gamma: float
    groups_per_step: int  # ppo.num_prompts_per_step
    max_gen_batches: int

    def keep(self, experience: Experience) -> torch.Tensor:
        """[B / group_size] bool: the groups that train. Needs ``rewards`` (and ``old_values`` for
        ``value_error``); an episode's return includes its turns' rewards. A group with a sample whose reward chunk
        failed (``sample_mask`` 0 at this point) is not kept: its signal is unknown."""
        returns = experience.total_rewards
        if self.criterion == "reward_std":
            keep = groups_with_reward_spread(returns, self.group_size)
        else:
            mask = experience.response_mask
            first_return = first_response_token(outcome_returns(returns, mask, self.gamma), mask)
            first_value = first_response_token(experience.old_values, mask)
            keep = groups_with_value_error(first_return, first_value, self.group_size, self.min_value_error)
        if experience.sample_mask is not None:
            keep &= experience.sample_mask.bool().reshape(-1, self.group_size).all(dim=1)
        return keep

    def rows(self, groups: torch.Tensor) -> list[int]:
        """The sample rows of the groups marked in ``groups`` ([G] bool), in order."""
        return [g * self.group_size + i for g in groups.nonzero().flatten().tolist() for i in range(self.group_size)]

    def fill(
        self, rollout: Rollout, scored: RewardBreakdown | None, score_batch: ScoreBatch, pad_id: int
    ) -> ScoredBatch:
        """The first ``groups_per_step`` groups that pass the criterion, from ``rollout`` (scored: ``scored``) and as
        many more batches of ``score_batch`` as that takes (the last one's surplus is dropped), with the counts of
        ``train/dynamic_sampling/*``; raises RunStopped past ``max_gen_batches``."""
        parts, problems, scores, have, passed, failed = [], [], [], 0, 0, 0
        for extra in range(self.max_gen_batches):
            if extra > 0:
                rollout, scored = score_batch(extra)
            groups = self.keep(rollout.experience)
            passing = groups.nonzero().flatten()
            passed, failed = passed + len(passing), failed + len(groups) - len(passing)
            used = torch.zeros_like(groups)
            used[passing[: self.groups_per_step - have]] = True
            rows = self.rows(used)
            if rows:
                # the filter keeps no group with a failed sample: every kept row trains
                parts.append(rollout.experience.take(torch.tensor(rows)).replace(sample_mask=None))
                problems += [rollout.problems[i] for i in rows]
                scores.append(scored.take(rows) if scored is not None else None)
            have += len(rows) // self.group_size
            if have == self.groups_per_step:
                break
        else:
            raise RunStopped(
                f"ppo.dynamic_sampling: only {have} of the {self.groups_per_step} prompt groups a step trains on "
                f"passed the {self.criterion} criterion in {self.max_gen_batches} generated batches "
                f"(ppo.dynamic_sampling.max_gen_batches); the others carry no learning signal (reward_std: every "
                f"sample of the group got the same reward) or hold a sample whose reward chunk failed. Raise "
                f"max_gen_batches or num_generations_per_prompt, or train on problems nearer the policy's level"
            )
        kept = Rollout(problems, concat_rows(parts, pad_id), rollout.staleness, rollout.metrics)
        means = concat_breakdowns(scores).means() if scores[0] is not None else {}
        counts = {"gen_batches": extra + 1, "kept_groups": passed, "filtered_groups": failed}
        return ScoredBatch(kept, means, {f"train/dynamic_sampling/{name}": float(n) for name, n in counts.items()})


def build_group_filter(cfg: Config) -> GroupFilter | None:
    """The criterion of ``ppo.dynamic_sampling``, or None when every group trains."""
    sampling = cfg.ppo.dynamic_sampling
    if not sampling.enabled:
        return None
    return GroupFilter(
        sampling.criterion,
        cfg.ppo.num_generations_per_prompt,
        sampling.min_value_error,
        cfg.ppo.gae.gamma,
        cfg.ppo.num_prompts_per_step,
        sampling.max_gen_batches,
    )
