"""One worker role (policy or critic) on its pool of ranks, seen the same way from every rank.

The trainer is one SPMD program. When policy and critic are colocated every rank holds both workers and a
call's result is already whole on every rank. When they live in separate pools a rank holds one of them:
``local`` runs a call where the worker lives, ``share`` hands its result (broadcast from the pool's first
rank) to every rank. Splitting the two lets both pools work at once: start both local calls, then share.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from dtppo.distributed.comm import broadcast_object
from dtppo.workers.base import Worker

W = TypeVar("W", bound=Worker)
T = TypeVar("T")


class Pool(Generic[W]):
    def __init__(self, worker: W | None, ranks: range, colocated: bool):
        self.worker, self.ranks, self.colocated = worker, ranks, colocated

    @property
    def here(self) -> bool:
        """This rank holds the worker."""
        return self.worker is not None

    def local(self, call: Callable[[W], T]) -> T | None:
        """``call(worker)`` on the pool's ranks; None elsewhere."""
        return call(self.worker) if self.worker is not None else None

    def share(self, result: T | None) -> T:
        """The pool's result of a ``local`` call, on every rank."""
        return result if self.colocated else broadcast_object(result, src=self.ranks[0])

    def run(self, call: Callable[[W], T]) -> T:
        return self.share(self.local(call))

    # bound calls, not Worker.*: the policy worker adds hooks of its own
    def inference(self):
        """The worker's no-grad forward passes around a block (``prepare_for_inference``/``finish_inference``)."""
        return self._phase(lambda w: w.prepare_for_inference(), lambda w: w.finish_inference())

    def generation(self):
        """Sampling around a block (policy only): wakes a sleeping vLLM engine, puts it back to sleep after."""
        return self._phase(lambda w: w.prepare_for_generation(), lambda w: w.finish_generation())

    def training(self):
        return self._phase(lambda w: w.prepare_for_training(), lambda w: w.finish_training())

    @contextmanager
    def _phase(self, prepare: Callable[[W], None], finish: Callable[[W], None]) -> Iterator[None]:
        self.local(prepare)
        yield
        self.local(finish)
