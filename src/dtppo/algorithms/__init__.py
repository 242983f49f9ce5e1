"""The PPO math: advantages, KL estimators and losses, as small pure functions."""
