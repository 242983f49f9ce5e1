"""dtppo as a library: ``load_config`` and ``PPOTrainer`` (``trainer``), what their arguments become (``inputs``),
the run's events for the caller's callbacks (``events``). The command line is a thin layer over them."""
