"""Scoring a batch of completions with the reward functions, off the training loop's process.

A local run fans chunks out to a process pool, a Ray run to long-lived Ray scoring actors (sync actors run
their calls in their main thread, and import math-verify once instead of once per task). Either way the
functions run in a worker's main thread, where math-verify's own timeouts work, and a chunk that misses
``timeout_s`` scores 0.0 for every function instead of stalling the step. ``num_workers: 0`` scores in this
process. A function that raises or returns unusable scores stops the run with its name
(``functions.RewardFunctionError``), wherever it ran.

Memory and liveness are bounded whatever the batch holds:
- workers get chunks of at most ``MAX_CHUNK`` samples; when only built-in verifiers run, a chunk carries only what
  they read (``answers.tail``: the last ``TAIL_CHARS`` characters of each completion and reference), so a
  worker's memory does not grow with the batch size or response length;
- pool workers import ``dtppo.rewards.functions`` (not torch) and build math-verify's parser when they start;
  ``timeout_s`` bounds scoring, not process start-up: a fresh pool is waited for (up to ``STARTUP_S``) first;
- a late chunk means its worker is stuck (or died): that worker is terminated and replaced (``ProcessPool``;
  the Ray path kills and replaces the late actors), so one bad step cannot starve every later one.
"""

from __future__ import annotations

import logging

from dtppo.answers import tail
from dtppo.config import RewardConfig
from dtppo.config.reward_spec import parse_spec
from dtppo.process_pool import ProcessPool
from dtppo.rewards.functions import (
    RewardFunctionError,
    Scores,
    completion_text,
    load_functions,
    reference_text,
    score_job,
)
from dtppo.rewards.pool_worker import serve

log = logging.getLogger(__name__)

MAX_CHUNK = 256  # samples per task: bounds a worker's memory and the share of a batch one late task zeroes
STARTUP_S = 120.0  # longest wait for fresh scoring processes to start (not counted in timeout_s)


class ScoringActor:
    """Plain class; made a Ray actor by RewardScorer."""

    def __init__(self, specs: list[str]):
        self.functions = load_functions(specs)

    def score(self, job: tuple) -> tuple:
        return score_job(self.functions, job)


def _chunks(n: int, workers: int) -> list[slice]:
    """Contiguous slices covering range(n): spread over all workers, none longer than MAX_CHUNK."""
    size = max(1, min(MAX_CHUNK, -(-n // workers)))
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


class RewardScorer:
    """Runs the reward functions ``specs`` name in ``cfg.num_workers`` processes (backend "local") or Ray actors
    (backend "ray"), or in this process (``num_workers: 0``).

    ``late_chunks`` counts the chunks that missed ``timeout_s`` (scored 0.0) since construction; ``Rewarder``
    reports each batch's count (``train/reward/late_chunks``)."""

    def __init__(self, cfg: RewardConfig, backend: str, specs: list[str]):
        self.cfg, self.backend = cfg, backend
        parsed = [parse_spec(s) for s in specs]
        self.specs = [p.absolute() for p in parsed]
        self.builtin_only = all(p.kind == "builtin" for p in parsed)
        self.pool = None
        self.late_chunks = 0
        # No functions (a reward model alone): nothing to fan out, so no processes to start.
        self.num_workers = cfg.num_workers if specs else 0
        if self.num_workers == 0:
            self.functions = load_functions(self.specs)
        if self.num_workers > 0 and backend == "local":
            self.pool = ProcessPool(cfg.num_workers, serve, (self.specs,), "dtppo-reward")
        if self.num_workers > 0 and backend == "ray":
            import ray

            # num_cpus=0: the rank actors hold the placement group's CPUs; scoring must still schedule.
            self._actor_cls = ray.remote(num_cpus=0)(ScoringActor)
            self.actors = [self._actor_cls.remote(self.specs) for _ in range(cfg.num_workers)]

    def wait_ready(self) -> None:
        """Block until the pool's processes have started (at most ``STARTUP_S``); ``score`` does this too."""
        if self.pool is not None:
            self.pool.wait_ready(STARTUP_S)

    def score(self, prompts: list, completions: list, columns: dict[str, list]) -> list[Scores]:
        """Each function's scores (in ``specs`` order), one per sample; a late chunk scores 0.0 for every function
        and is counted in a warning. Raises ``RewardFunctionError`` when a function failed."""
        if self.builtin_only:
            prompts, completions, columns = _builtin_inputs(prompts, completions, columns)
        if self.num_workers == 0:
            return _answer(score_job(self.functions, (0, prompts, completions, columns)))
        parts = _chunks(len(completions), self.num_workers)
        jobs = [(p.start, prompts[p], completions[p], {k: v[p] for k, v in columns.items()}) for p in parts]
        if self.backend == "ray":
            answers = self._score_ray(jobs)
        else:
            self.wait_ready()
            answers = self.pool.map(jobs, self.cfg.timeout_s)
        return self._collect(parts, answers)

    def _score_ray(self, jobs: list[tuple]) -> list[tuple | None]:
        import ray

        owners = [i % len(self.actors) for i in range(len(jobs))]
        refs = [self.actors[a].score.remote(job) for a, job in zip(owners, jobs)]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.cfg.timeout_s)
        answers = [_ray_result(r) if r in ready else None for r in refs]
        for a in sorted({a for a, r in zip(owners, answers) if r is None}):
            # a stuck actor is replaced, so the next step has its full capacity
            ray.kill(self.actors[a], no_restart=True)
            self.actors[a] = self._actor_cls.remote(self.specs)
        return answers

    def _collect(self, parts: list[slice], answers: list[tuple | None]) -> list[Scores]:
        late = sum(a is None for a in answers)
        if late:
            self.late_chunks += late
            log.warning("%d of %d reward chunks missed the time bound and score 0.0", late, len(parts))
        chunks = [
            _answer(a) if a is not None else [[0.0] * (p.stop - p.start)] * len(self.specs)
            for p, a in zip(parts, answers)
        ]
        return [[s for chunk in chunks for s in chunk[f]] for f in range(len(self.specs))]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.backend == "ray" and self.num_workers > 0:
            import ray

            for actor in self.actors:
                ray.kill(actor, no_restart=True)


def _builtin_inputs(prompts: list, completions: list, columns: dict[str, list]) -> tuple[list, list, dict]:
    """All the built-in verifiers read: each completion's text and reference, their last ``TAIL_CHARS`` characters."""
    texts = [tail(completion_text(c)) for c in completions]
    answer = [tail(reference_text(a)) for a in columns.get("answer", [""] * len(texts))]
    return [None] * len(texts), texts, {"answer": answer}


def _answer(answer: tuple) -> list[Scores]:
    kind, payload = answer
    if kind == "error":
        raise RewardFunctionError(payload)
    return payload


def _ray_result(ref) -> tuple | None:
    import ray

    try:
        return ray.get(ref)
    except Exception:  # noqa: BLE001 - a dead actor's chunk scores 0.0; the actor is replaced
        return None
