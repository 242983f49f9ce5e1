"""Scoring a batch of responses against their ground truths, off the training loop's process.

A local run fans chunks out to a process pool, a Ray run to long-lived Ray scoring actors (sync actors run
their calls in their main thread, and import math-verify once instead of once per task). Either way
``gsm8k_reward`` runs in a worker's main thread, where math-verify's own timeouts work, and a chunk that misses
``timeout_s`` scores 0.0 instead of stalling the step. ``num_workers: 0`` scores in this process.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing

import torch

from dtppo.config import RewardConfig
from dtppo.rewards.math import gsm8k_reward

log = logging.getLogger(__name__)


def score_responses(responses: list[str], ground_truths: list[str]) -> torch.Tensor:
    """Verifier reward per sample, in this process. Returns [B] float32 of 0.0 / 1.0; never raises."""
    return torch.tensor(_score_chunk(responses, ground_truths), dtype=torch.float32)


def _score_chunk(responses: list[str], ground_truths: list[str]) -> list[float]:
    return [gsm8k_reward(r, g) for r, g in zip(responses, ground_truths)]


class ScoringActor:
    """Plain class; made a Ray actor by RewardScorer."""

    def score(self, responses: list[str], ground_truths: list[str]) -> list[float]:
        return _score_chunk(responses, ground_truths)


def _chunks(n: int, parts: int) -> list[slice]:
    size = -(-n // parts)
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


class RewardScorer:
    """Fans scoring out to ``num_workers`` processes (backend "local") or Ray actors (backend "ray")."""

    def __init__(self, cfg: RewardConfig, backend: str):
        self.cfg, self.backend = cfg, backend
        self.pool = None
        if cfg.num_workers > 0 and backend == "local":
            self.pool = cf.ProcessPoolExecutor(cfg.num_workers, mp_context=multiprocessing.get_context("spawn"))
        if cfg.num_workers > 0 and backend == "ray":
            import ray

            # num_cpus=0: the rank actors hold the placement group's CPUs; scoring must still schedule.
            self._actor_cls = ray.remote(num_cpus=0)(ScoringActor)
            self.actors = [self._actor_cls.remote() for _ in range(cfg.num_workers)]

    def score(self, responses: list[str], ground_truths: list[str]) -> torch.Tensor:
        """[B] float32 rewards; late chunks score 0.0 and are counted in a warning."""
        if self.cfg.num_workers == 0:
            return score_responses(responses, ground_truths)
        parts = _chunks(len(responses), self.cfg.num_workers)
        if self.backend == "ray":
            scores = self._score_ray(responses, ground_truths, parts)
        else:
            scores = self._score_pool(responses, ground_truths, parts)
        return torch.tensor(scores, dtype=torch.float32)

    def _score_pool(self, responses, truths, parts) -> list[float]:
        futures = [self.pool.submit(_score_chunk, responses[p], truths[p]) for p in parts]
        done, _ = cf.wait(futures, timeout=self.cfg.timeout_s)
        return self._collect(parts, [f.result() if f in done else None for f in futures])

    def _score_ray(self, responses, truths, parts) -> list[float]:
        import ray

        refs = [actor.score.remote(responses[p], truths[p]) for actor, p in zip(self.actors, parts)]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.cfg.timeout_s)
        results = [ray.get(r) if r in ready else None for r in refs]
        for i, result in enumerate(results):
            if result is None:  # a stuck actor is replaced, so the next step has its full capacity
                ray.kill(self.actors[i], no_restart=True)
                self.actors[i] = self._actor_cls.remote()
        return self._collect(parts, results)

    @staticmethod
    def _collect(parts: list[slice], results: list[list[float] | None]) -> list[float]:
        late = sum(r is None for r in results)
        if late:
            log.warning("%d reward chunks missed the time bound and score 0.0", late)
        return [s for p, r in zip(parts, results) for s in (r if r is not None else [0.0] * (p.stop - p.start))]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        if self.backend == "ray" and self.cfg.num_workers > 0:
            import ray

            for actor in self.actors:
                ray.kill(actor, no_restart=True)
