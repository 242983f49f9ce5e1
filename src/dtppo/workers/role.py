"""The policy and the critic as roles: one worker on its pool of ranks, called the same way from every rank.

The trainer is one SPMD program: every rank runs ``PPOLoop.step``. When policy and critic are colocated
every rank holds both workers and a call's result is already whole on every rank. When they live in separate
pools (``cluster.policy_ranks``) a rank holds one of them: a role's methods run where its worker lives and
hand the result (broadcast from the pool's first rank) to every rank. ``train`` and the checkpoint calls
stay local (None off the pool): the step starts both updates, then ``share``s their metrics, so separate
pools update at the same time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

import torch

from dtppo.data.problem import Problem
from dtppo.distributed.comm import all_gather_object, broadcast_object, rank
from dtppo.generation.responses import Responses, sample_responses
from dtppo.types import Experience, SampleRequest
from dtppo.workers.base import Worker
from dtppo.workers.policy import PolicyWorker
from dtppo.workers.value import ValueWorker

W = TypeVar("W", bound=Worker)
T = TypeVar("T")


class Role(Generic[W]):
    """What both roles offer: training, lifecycle phases, counters and checkpoint state."""

    def __init__(self, worker: W | None, ranks: range, colocated: bool):
        self.worker, self.ranks, self.colocated = worker, ranks, colocated

    def share(self, result: T | None) -> T:
        """The pool's result of a local call (``train``), on every rank."""
        return result if self.colocated else broadcast_object(result, src=self.ranks[0])

    def _local(self, call: Callable[[W], T]) -> T | None:
        return call(self.worker) if self.worker is not None else None

    def _everywhere(self, call: Callable[[W], T]) -> T:
        return self.share(self._local(call))

    # ---- training (local: share the metrics once both roles have started)
    def train(self, experience: Experience) -> dict[str, torch.Tensor] | None:
        """One epoch of this role's update on its ranks; its metrics there, None elsewhere."""
        return self._local(lambda w: w.train(experience))

    def skipped_steps(self) -> int:
        """Optimizer steps skipped for a non-finite loss or gradient so far, on every rank."""
        return self._everywhere(lambda w: w.skipped_steps)

    # ---- lifecycle (bound calls, not Worker.*: the policy worker adds hooks of its own)
    def inference(self):
        """The worker's no-grad forward passes around a block (``prepare_for_inference`` / ``finish_inference``)."""
        return self._phase(lambda w: w.prepare_for_inference(), lambda w: w.finish_inference())

    def training(self):
        """The worker's training lifecycle around a block (``prepare_for_training`` / ``finish_training``)."""
        return self._phase(lambda w: w.prepare_for_training(), lambda w: w.finish_training())

    @contextmanager
    def _phase(self, prepare: Callable[[W], None], finish: Callable[[W], None]) -> Iterator[None]:
        self._local(prepare)
        yield
        self._local(finish)

    # ---- checkpoints
    def checkpoint_state(self) -> dict | None:
        """Model and optimizer state in the torch.distributed.checkpoint layout, on the role's ranks (sharded
        there); None elsewhere."""
        return self._local(lambda w: w.checkpoint_state())

    def replicated_state(self) -> dict:
        """Schedule position and skipped-step counts, the same on every rank."""
        return self._everywhere(lambda w: w.replicated_state())

    def load_checkpoint(self, sharded: dict | None, replicated: dict) -> None:
        """Restore the worker on the role's ranks (``sharded`` is None elsewhere)."""
        self._local(lambda w: w.load_checkpoint(sharded, replicated))


class PolicyRole(Role[PolicyWorker]):
    def generation(self):
        """Sampling around a block: wakes a sleeping vLLM engine, puts it back to sleep after
        (``prepare_for_generation`` / ``finish_generation``)."""
        return self._phase(lambda p: p.prepare_for_generation(), lambda p: p.finish_generation())

    def generate(self, request: SampleRequest) -> Experience:
        """Rollouts of the request's prompts (sampled by the policy's dp ranks), the whole batch on every rank."""
        return self._everywhere(lambda p: p.generate(request))

    def get_logprobs(self, experience: Experience) -> torch.Tensor:
        """log π(x_t | x_<t) of the current policy, [B, T] on every rank."""
        return self._everywhere(lambda p: p.get_logprobs(experience))

    def get_reference_logprobs(self, experience: Experience) -> torch.Tensor:
        """Log-probs of the frozen reference policy, [B, T] on every rank."""
        return self._everywhere(lambda p: p.get_reference_logprobs(experience))

    def refit(self, version: int) -> None:
        """Give the generator the weights just trained (policy version ``version``), on the policy's ranks."""
        self._local(lambda p: p.refit(version))

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The whole policy's weights on the policy's ranks (a collective there), None elsewhere."""
        return self._local(lambda p: p.full_state_dict())

    def close(self) -> None:
        """End of the run: release the generator's resources (the vLLM engine's process groups)."""
        self._local(lambda p: p.close())

    def sample_validation(self, problems: list[Problem], step: int) -> Responses:
        """Validation answers to ``problems`` from the policy's generators, on every rank: each policy rank samples
        one contiguous share of the set (its generator decodes alone, with no collective per token), and the
        shares are gathered in order. An answer's noise is seeded by its problem's index in the whole set, so the
        answers do not depend on how many ranks shared the work."""
        share = None
        if self.worker is not None:
            index, count = self.ranks.index(rank()), len(self.ranks)
            start, stop = len(problems) * index // count, len(problems) * (index + 1) // count
            p = self.worker
            cfg, shared = p.cfg, problems[start:stop]
            share = sample_responses(
                p.generator,
                p.tokenizer,
                shared,
                cfg.policy.generation,
                cfg.ppo.validation,
                cfg.data,
                cfg.ppo.seed,
                step,
                first_index=start,
            )
        shares = [s for s in all_gather_object(share) if s is not None]
        return Responses([t for s in shares for t in s.texts], [n for s in shares for n in s.lengths])


class ValueRole(Role[ValueWorker]):
    def get_values(self, experience: Experience) -> torch.Tensor:
        """V(s_t) for every position of every row, [B, T] on every rank."""
        return self._everywhere(lambda v: v.get_values(experience))
