"""The errors that stop a run, each with its exit code.

A run stops with a ``RunStopped`` subclass when continuing would waste compute or lose data; the CLI turns it into one
line on stderr and the class's ``exit_code`` (docs/guides/reliability.md's table); a traceback only with
``DTPPO_DEBUG=1``.
"""

from __future__ import annotations


class RunStopped(RuntimeError):
    """The run cannot usefully continue; ``str(err)`` is the one-line explanation for the user."""

    exit_code = 1


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
