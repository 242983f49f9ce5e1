"""What a run reports: the metrics logger, trackers (W&B, MLflow), metric reductions, profiling and plots."""
