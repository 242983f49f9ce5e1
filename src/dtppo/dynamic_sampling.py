"""Dynamic sampling (DAPO, Yu et al. 2025, §3.2): which prompt groups of a scored batch train, chosen once from the
config (``ppo.dynamic_sampling``); the trainer generates more batches until enough groups are kept."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dtppo.algorithms.advantages import outcome_returns
from dtppo.algorithms.filtering import first_response_token, groups_with_reward_spread, groups_with_value_error
from dtppo.config import Config
from dtppo.types import Experience


@dataclass(frozen=True)
class GroupFilter:
    """The criterion ``ppo.dynamic_sampling.criterion`` over groups of ``group_size`` adjacent samples."""

    criterion: str
    group_size: int
    min_value_error: float
    gamma: float

    def keep(self, experience: Experience) -> torch.Tensor:
        """[B / group_size] bool: the groups that train. Needs ``rewards`` (and ``old_values`` for
        ``value_error``); an episode's return includes its turns' rewards. A group with a sample whose reward chunk
        failed (``sample_mask`` 0 at this point) is not kept: its signal is unknown."""
        returns = experience.episode_returns
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


def build_group_filter(cfg: Config) -> GroupFilter | None:
    """The criterion of ``ppo.dynamic_sampling``, or None when every group trains."""
    sampling = cfg.ppo.dynamic_sampling
    if not sampling.enabled:
        return None
    return GroupFilter(sampling.criterion, cfg.ppo.num_generations_per_prompt, sampling.min_value_error, cfg.ppo.gamma)
