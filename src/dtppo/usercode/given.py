"""What a Python caller gives a run besides its config (``dtppo.PPOTrainer``): reward functions by name and in-memory
datasets. The ranks and the scoring processes are other processes (forkserver, spawn, Ray actors), so these travel
pickled by value with cloudpickle: closures, lambdas and functions of a notebook or a script's ``__main__`` included,
which the standard pickle sends by reference only. Only the processes a run starts unpickle them, never a file."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from dtppo.errors import InputError


@dataclass(frozen=True)
class GivenInputs:
    """functions: (name, callable) in order, the names ``reward.functions`` holds; train_rows / validation_rows: rows
    (a ``datasets.Dataset`` or a list of dicts) that replace ``data.train`` / ``data.validation``, None: the file."""

    functions: tuple[tuple[str, Callable[..., Any]], ...] = ()
    train_rows: Iterable[Mapping] | None = field(default=None, repr=False)
    validation_rows: Iterable[Mapping] | None = field(default=None, repr=False)

    @property
    def rows(self) -> tuple[Iterable[Mapping] | None, Iterable[Mapping] | None]:
        return self.train_rows, self.validation_rows

    def function(self, name: str) -> Callable[..., Any] | None:
        return dict(self.functions).get(name)

    def functions_only(self) -> GivenInputs:
        """What a scoring process needs: the functions, not the rows."""
        return GivenInputs(self.functions)

    def check_portable(self, destination: str) -> None:
        """Each function and dataset pickles by value, or an ``InputError`` naming the first that does not and
        ``destination`` (where it would have gone, e.g. "the 2 scoring processes (reward.num_workers)")."""
        parts = [(f"reward function {name!r}", fn) for name, fn in self.functions]
        parts += [("train_dataset", self.train_rows), ("eval_dataset", self.validation_rows)]
        for what, value in parts:
            try:
                cloudpickle.dumps(value)
            except Exception as err:  # whatever the object holds (a lock, a socket, a C handle) raises its own type
                detail = str(err).splitlines()[0] if str(err) else ""
                raise InputError(
                    f"{what} cannot be sent to {destination}: {type(err).__name__}: {detail}; give it nothing that "
                    "only this process can hold"
                ) from None

    def __reduce__(self) -> tuple:
        return _restored, (cloudpickle.dumps((self.functions, self.train_rows, self.validation_rows)),)


NOTHING_GIVEN = GivenInputs()  # a run whose every input its config names


def _restored(payload: bytes) -> GivenInputs:
    return GivenInputs(*cloudpickle.loads(payload))
