"""Rewards: reward functions in TRL's convention (built-in verifiers or the user's), a learned reward model, and the
scoring pool that runs the functions off the training loop."""

from dtppo.rewards.functions import RewardFunctionError, reward_function

__all__ = ["RewardFunctionError", "reward_function"]
