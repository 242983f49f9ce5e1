"""The PPO loop and what it builds once from the config: rollouts, the advantage estimator, dynamic sampling, the
critic's warmup, the sample filters, the step's metrics."""
