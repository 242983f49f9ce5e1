"""The errors dtppo raises to its caller: ``ConfigError`` for a bad recipe, key or value (the command line's exit 2,
its line prefixed "config error"), and the ``RunStopped`` subclasses that stop a run, each with its exit code.

A run stops with a ``RunStopped`` subclass when continuing would waste compute or lose data; the CLI turns it into one
line on stderr and the class's ``exit_code`` (docs/guides/reliability.md's table); a traceback only with
``DTPPO_DEBUG=1``. A library caller (``dtppo.PPOTrainer``) gets the exception itself.
"""

from __future__ import annotations

from dtppo.config.rules import ConfigError  # defined with the config, which imports nothing of dtppo

__all__ = [
    "ConfigError",
    "RunStopped",
    "InputError",
    "NonFiniteError",
    "CheckpointError",
    "BelowFloorError",
    "GenerationError",
]


class RunStopped(RuntimeError):
    """The run cannot usefully continue; ``str(err)`` is the one-line explanation for the user. ``reported``: the rank
    that saw it printed that line already (the error stands for a rank process's exit)."""

    exit_code = 1
    reported = False


class InputError(RunStopped):
    """An input the user named (data, checkpoint, model directory, log directory) is missing or unusable;
    the message names the config key or the path."""

    exit_code = 2


class NonFiniteError(RunStopped):
    """Too many consecutive optimizer steps had a non-finite loss or gradient."""

    exit_code = 3


class CheckpointError(RunStopped):
    """A checkpoint could not be written, or one on disk is incomplete or corrupted."""

    exit_code = 4


class BelowFloorError(RunStopped):
    """A model PPO would start from is below the accuracy its recipe states as the floor (``sft.min_accuracy``)."""

    exit_code = 5


class GenerationError(RunStopped):
    """The generation ranks (``cluster.generation_ranks``) died, stopped answering, or answered out of protocol."""

    exit_code = 6
