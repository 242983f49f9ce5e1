"""Scoring a batch of responses against their ground truths, off the training loop's process.

A local run fans chunks out to a process pool, a Ray run to long-lived Ray scoring actors (sync actors run
their calls in their main thread, and import math-verify once instead of once per task). Either way
``gsm8k_reward`` runs in a worker's main thread, where math-verify's own timeouts work, and a chunk that misses
``timeout_s`` scores 0.0 instead of stalling the step. ``num_workers: 0`` scores in this process.

Memory and liveness are bounded whatever the batch holds:
- workers get only what the reward reads (``reward_input``: the last ``TAIL_CHARS`` characters), in chunks of
  at most ``MAX_CHUNK`` pairs, so a worker's memory does not grow with the batch size or response length;
- pool workers import ``dtppo.rewards.math`` only (not torch) and build math-verify's parser when they start;
  ``timeout_s`` bounds scoring, not process start-up: a fresh pool is waited for (up to ``STARTUP_S``) first;
- a late chunk means its worker is stuck (or died): that worker is terminated and replaced (``ScoringPool``;
  the Ray path kills and replaces the late actors), so one bad step cannot starve every later one.
"""

from __future__ import annotations

import logging

import torch

from dtppo.config import RewardConfig
from dtppo.rewards.math import gsm8k_rewards, reward_input
from dtppo.rewards.pool import ScoringPool

log = logging.getLogger(__name__)

MAX_CHUNK = 256  # pairs per task: bounds a worker's memory and the share of a batch one late task zeroes
STARTUP_S = 120.0  # longest wait for fresh scoring processes to start (not counted in timeout_s)


def score_responses(responses: list[str], ground_truths: list[str]) -> torch.Tensor:
    """Verifier reward per sample, in this process. Returns [B] float32 of 0.0 / 1.0; never raises."""
    return torch.tensor(gsm8k_rewards(responses, ground_truths), dtype=torch.float32)


class ScoringActor:
    """Plain class; made a Ray actor by RewardScorer."""

    def score(self, responses: list[str], ground_truths: list[str]) -> list[float]:
        return gsm8k_rewards(responses, ground_truths)


def _chunks(n: int, workers: int) -> list[slice]:
    """Contiguous slices covering range(n): spread over all workers, none longer than MAX_CHUNK."""
    size = max(1, min(MAX_CHUNK, -(-n // workers)))
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


class RewardScorer:
    """Fans scoring out to ``num_workers`` processes (backend "local") or Ray actors (backend "ray").

    ``late_chunks`` counts the chunks that missed ``timeout_s`` (scored 0.0) since construction."""

    def __init__(self, cfg: RewardConfig, backend: str):
        self.cfg, self.backend = cfg, backend
        self.pool = None
        self.late_chunks = 0
        if cfg.num_workers > 0 and backend == "local":
            self.pool = ScoringPool(cfg.num_workers)
        if cfg.num_workers > 0 and backend == "ray":
            import ray

            # num_cpus=0: the rank actors hold the placement group's CPUs; scoring must still schedule.
            self._actor_cls = ray.remote(num_cpus=0)(ScoringActor)
            self.actors = [self._actor_cls.remote() for _ in range(cfg.num_workers)]

    def wait_ready(self) -> None:
        """Block until the pool's processes have started (at most ``STARTUP_S``); ``score`` does this too."""
        if self.pool is not None:
            self.pool.wait_ready(STARTUP_S)

    def score(self, responses: list[str], ground_truths: list[str]) -> torch.Tensor:
        """[B] float32 rewards; late chunks score 0.0 and are counted in a warning."""
        if self.cfg.num_workers == 0:
            return score_responses(responses, ground_truths)
        responses = [reward_input(r) for r in responses]
        ground_truths = [reward_input(g) for g in ground_truths]
        parts = _chunks(len(responses), self.cfg.num_workers)
        if self.backend == "ray":
            scores = self._score_ray(responses, ground_truths, parts)
        else:
            scores = self._score_pool(responses, ground_truths, parts)
        return torch.tensor(scores, dtype=torch.float32)

    def _score_pool(self, responses, truths, parts) -> list[float]:
        self.wait_ready()
        return self._collect(parts, self.pool.map([(responses[p], truths[p]) for p in parts], self.cfg.timeout_s))

    def _score_ray(self, responses, truths, parts) -> list[float]:
        import ray

        owners = [i % len(self.actors) for i in range(len(parts))]
        refs = [self.actors[a].score.remote(responses[p], truths[p]) for a, p in zip(owners, parts)]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.cfg.timeout_s)
        results = [_ray_result(r) if r in ready else None for r in refs]
        for a in sorted({a for a, r in zip(owners, results) if r is None}):
            # a stuck actor is replaced, so the next step has its full capacity
            ray.kill(self.actors[a], no_restart=True)
            self.actors[a] = self._actor_cls.remote()
        return self._collect(parts, results)

    def _collect(self, parts: list[slice], results: list[list[float] | None]) -> list[float]:
        late = sum(r is None for r in results)
        if late:
            self.late_chunks += late
            log.warning("%d of %d reward chunks missed the time bound and score 0.0", late, len(parts))
        return [s for p, r in zip(parts, results) for s in (r if r is not None else [0.0] * (p.stop - p.start))]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.backend == "ray" and self.cfg.num_workers > 0:
            import ray

            for actor in self.actors:
                ray.kill(actor, no_restart=True)


def _ray_result(ref) -> list[float] | None:
    import ray

    try:
        return ray.get(ref)
    except Exception:  # noqa: BLE001 - a dead actor's chunk scores 0.0; the actor is replaced
        return None
