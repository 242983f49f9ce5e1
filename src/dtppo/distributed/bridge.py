"""The link between the training world and the generation world: training rank 0 and every generation rank.

It is a process group of its own (gloo; on GPUs a second one, nccl, carries the weights between devices), built
directly from the run's rendezvous store (``launch.run_worlds``), outside torch's registry of groups: the two
worlds each have their own default group, so no collective of one ever waits for the other. Bridge rank 0 is
training rank 0; generation rank g is bridge rank 1 + g.

What crosses it:
- ``post`` (training rank 0 -> every generation rank): a broadcast that returns at once. The tensors must stay
  untouched until it completes, so the bridge keeps them, and the training rank goes on training while the
  generation ranks are still busy with earlier work; ``wait`` waits for one post.
- ``take`` (a generation rank): the next post, blocking.
- ``send`` / ``recv``: point to point, generation rank 0 -> training rank 0 (the batches): the send returns at once
  (the generation ranks go on with the next request), the receive blocks.

A peer that dies closes its sockets: the next operation that needs it raises ``BridgeError`` at once, naming the
peer's side, instead of waiting; a peer that stops answering raises after the bridge's timeout.
"""

from __future__ import annotations

from collections import deque
from datetime import timedelta

import torch
import torch.distributed as dist

TRAINER = 0  # bridge rank of training rank 0
_REPLY_TAG = 7


class BridgeError(RuntimeError):
    """The other world died or stopped answering; ``str(err)`` says which and what was being done."""


class Bridge:
    """One end of the link (module docstring). ``rank``: 0 on training rank 0, 1 + g on generation rank g;
    ``size``: 1 + the number of generation ranks. ``weights_device``: where weight tensors cross (cuda: over
    nccl between the GPUs; cpu: over gloo like everything else)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout_s: float, weights_device: torch.device) -> None:
        self.rank, self.size = rank, size
        timeout = timedelta(seconds=timeout_s)
        self.group = dist.ProcessGroupGloo(dist.PrefixStore("bridge", store), rank, size, timeout)
        self.weights_device = weights_device
        self.weights_group = self.group
        if weights_device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.weights_group = dist.ProcessGroupNCCL(dist.PrefixStore("bridge-nccl", store), rank, size, options)
        self._posted: deque[tuple[dist.Work, torch.Tensor]] = deque()

    # ---- training rank 0
    def post(self, tensor: torch.Tensor, what: str) -> dist.Work:
        """Broadcast ``tensor`` to every generation rank without waiting; it is kept until delivered. Weights (on
        ``weights_device``) go over the weights group, the rest over gloo. Returns the broadcast's work."""
        group = self.weights_group if tensor.device.type == "cuda" else self.group
        work = self._call(what, lambda: group.broadcast([tensor], _root(TRAINER)))
        self._keep(work, tensor)
        return work

    def wait(self, work: dist.Work, what: str) -> None:
        """Until ``work`` (a post) is delivered."""
        self._call(what, work.wait)

    def recv(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """Fill ``tensor`` with what generation rank 0 sends next."""
        self._call(what, lambda: self.group.recv([tensor], 1, _REPLY_TAG).wait())
        return tensor

    # ---- generation ranks
    def take(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """Fill ``tensor`` with training rank 0's next post."""
        group = self.weights_group if tensor.device.type == "cuda" else self.group
        self._call(what, lambda: group.broadcast([tensor], _root(TRAINER)).wait())
        return tensor

    def send(self, tensor: torch.Tensor, what: str) -> None:
        """Generation rank 0: ``tensor`` to training rank 0, without waiting for it to be received (the trainer asks
        for a batch only when its step needs it); it is kept until delivered, like a post."""
        self._keep(self._call(what, lambda: self.group.send([tensor], TRAINER, _REPLY_TAG)), tensor)

    # ----
    def close(self) -> None:
        """Wait for what is still posted (best effort: a peer that is gone cannot receive it), then shut the NCCL
        group down: built directly, not through the default group, nothing else would, and at exit under torchrun
        its destructor would warn or hang."""
        try:
            for work, _ in self._posted:
                work.wait()
        except RuntimeError:
            pass
        self._posted.clear()
        if self.weights_group is not self.group:
            self.weights_group.shutdown()

    def _keep(self, work: dist.Work, tensor: torch.Tensor) -> None:
        """Hold ``tensor`` until ``work`` (an operation still reading it) completes; drop what has completed."""
        self._posted.append((work, tensor))
        while self._posted and self._posted[0][0].is_completed():
            self._posted.popleft()

    def _call(self, what: str, operation):
        try:
            return operation()
        except RuntimeError as err:
            peer = "the generation ranks" if self.rank == TRAINER else "training rank 0"
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise BridgeError(f"{peer} did not answer while {what}: {first}") from None


def _root(rank: int) -> dist.BroadcastOptions:
    options = dist.BroadcastOptions()
    options.rootRank = rank
    return options
