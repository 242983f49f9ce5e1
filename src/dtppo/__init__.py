"""dtppo: PyTorch-native PPO post-training of language models with a correctly aligned critic.

``from dtppo import PPOTrainer, load_config``: the library's entry points (``dtppo.api``), imported on first use so
that ``import dtppo.config`` (the ranks, scoring processes, recipe checks) does not load torch."""

__version__ = "0.1.0"
__all__ = ["PPOTrainer", "RunResults", "load_config"]


def __getattr__(name: str):
    if name in ("PPOTrainer", "load_config"):
        from dtppo.api import trainer

        return getattr(trainer, name)
    if name == "RunResults":
        from dtppo.observability.report import RunResults

        return RunResults
    raise AttributeError(f"module 'dtppo' has no attribute {name!r}")
