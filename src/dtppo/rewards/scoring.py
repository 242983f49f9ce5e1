"""Scoring a batch of completions with the reward functions, off the training loop's process.

A local run fans chunks out to a process pool, a Ray run to long-lived Ray scoring actors (sync actors run
their calls in their main thread, and import math-verify once instead of once per task). Either way the
functions run in a worker's main thread, where math-verify's own timeouts work. ``num_workers: 0`` scores in this
process. A chunk whose process crashed, that missed ``timeout_s``, on which a function raised or ran out of memory
fails (``failures.ChunkFailure``): its samples get no score and the caller decides what that costs
(``failures.FailureBudget``). A function that returns unusable scores stops the run with its name
(``functions.RewardFunctionError``), wherever it ran.

Memory and liveness are bounded whatever the batch and the user's code do:
- workers get chunks of at most ``MAX_CHUNK`` samples; when only built-in verifiers run, a chunk carries only what
  they read (``answers.tail``: the last ``TAIL_CHARS`` characters of each reference, and of each completion when
  only answer verifiers run; a step verifier reads every line), so a worker's memory does not grow with the batch
  size (nor with the response length when only answers are checked);
- each worker runs under ``reward.memory_limit_mib`` and ``reward.max_print_bytes`` (``sandbox.confine``);
- pool workers import ``dtppo.rewards.functions`` (not torch) and build math-verify's parser when they start;
  ``timeout_s`` bounds scoring, not process start-up: a fresh pool is waited for (up to ``STARTUP_S``) first;
- a late chunk means its worker is stuck (or died): that worker is killed and replaced (``ProcessPool``;
  the Ray path kills and replaces the late actors), so one bad step cannot starve every later one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from dtppo.config import RewardConfig
from dtppo.config.reward_spec import STEP_VERIFIERS, parse_spec
from dtppo.data.answers import tail
from dtppo.rewards.failures import ChunkFailure
from dtppo.rewards.functions import (
    RewardFunctionError,
    Scores,
    completion_text,
    load_functions,
    reference_text,
    score_job,
)
from dtppo.rewards.pool_worker import OUTPUT_CAP, serve
from dtppo.usercode.given import GivenInputs
from dtppo.usercode.pool import JobFailure, ProcessPool
from dtppo.usercode.sandbox import confine, exit_if_forked

MAX_CHUNK = 256  # samples per task: bounds a worker's memory and the share of a batch one failed task loses
STARTUP_S = 120.0  # longest wait for fresh scoring processes to start (not counted in timeout_s)
_PREVIEW = 60  # characters of a failed chunk's first prompt quoted in its line


class ScoringActor:
    """Plain class; made a Ray actor by RewardScorer. Bounded as a pool worker is (Ray runs each actor in a process
    of its own)."""

    def __init__(self, specs: list[str], given: GivenInputs | None, memory_limit_mib: int, max_print_bytes: int):
        self.output = confine(memory_limit_mib, max_print_bytes, OUTPUT_CAP)
        self.functions = load_functions(specs, given)
        self.pid = os.getpid()

    def score(self, job: tuple) -> tuple:
        self.output.start_job()
        answer = score_job(self.functions, job)
        exit_if_forked(self.pid)
        self.output.flush()
        return answer


@dataclass(frozen=True)
class ScoredChunks:
    """A scored batch. scores: each function's (in ``specs`` order), one per sample, None for a failed chunk's;
    failed: one flag per sample; failures: the chunks that failed; chunks: how many the batch was split into."""

    scores: list[Scores]
    failed: list[bool]
    failures: list[ChunkFailure]
    chunks: int


def _chunks(n: int, workers: int) -> list[slice]:
    """Contiguous slices covering range(n): spread over all workers, none longer than MAX_CHUNK."""
    size = max(1, min(MAX_CHUNK, -(-n // workers)))
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


class RewardScorer:
    """Runs the reward functions ``specs`` name in ``cfg.num_workers`` processes (backend "local") or Ray actors
    (backend "ray"), or in this process (``num_workers: 0``); ``given``: the functions passed in Python, which travel
    to the processes pickled by value."""

    def __init__(self, cfg: RewardConfig, backend: str, specs: list[str], given: GivenInputs | None = None):
        self.cfg, self.backend = cfg, backend
        parsed = [parse_spec(s) for s in specs]
        self.specs = [p.absolute() for p in parsed]
        self.builtin_only = all(p.kind == "builtin" for p in parsed)
        self.whole_completions = any(p.name in STEP_VERIFIERS for p in parsed)  # read only with builtin_only
        self.pool = None
        # No functions (a reward model alone): nothing to fan out, so no processes to start.
        self.num_workers = cfg.num_workers if specs else 0
        bounds = (cfg.memory_limit_mib, cfg.max_print_bytes)
        given = given.functions_only() if given is not None and given.functions else None
        if self.num_workers == 0:
            self.functions = load_functions(self.specs, given)
        if self.num_workers > 0 and given is not None:
            given.check_portable(f"the {self.num_workers} scoring processes (reward.num_workers; 0 scores in this one)")
        if self.num_workers > 0 and backend == "local":
            self.pool = ProcessPool(cfg.num_workers, serve, (self.specs, given, *bounds), "dtppo-reward")
        if self.num_workers > 0 and backend == "ray":
            import ray

            # num_cpus=0: the rank actors hold the placement group's CPUs; scoring must still schedule.
            self._actor_cls = ray.remote(num_cpus=0)(ScoringActor)
            self._actor_args = (self.specs, given, *bounds)
            self.actors = [self._actor_cls.remote(*self._actor_args) for _ in range(cfg.num_workers)]

    def wait_ready(self) -> None:
        """Block until the pool's processes have started (at most ``STARTUP_S``); ``score`` does this too."""
        if self.pool is not None:
            self.pool.wait_ready(STARTUP_S)

    def score(
        self,
        prompts: list,
        completions: list,
        columns: dict[str, list],
        while_scoring: Callable[[], None] | None = None,
    ) -> ScoredChunks:
        """Each function's scores of each sample, and the chunks that failed. Raises ``RewardFunctionError`` when a
        function returned unusable scores. ``while_scoring`` runs once the chunks are out to the scoring processes or
        actors (never when this process scores: it would only wait)."""
        shown = prompts  # a failed chunk is named by its first prompt, which the built-ins' inputs leave out
        if self.builtin_only:
            prompts, completions, columns = _builtin_inputs(prompts, completions, columns, self.whole_completions)
        if self.num_workers == 0:
            parts = [slice(0, len(completions))]
            return self._collect(parts, [score_job(self.functions, (0, prompts, completions, columns))], shown)
        parts = _chunks(len(completions), self.num_workers)
        jobs = [(p.start, prompts[p], completions[p], {k: v[p] for k, v in columns.items()}) for p in parts]
        if self.backend == "ray":
            answers = self._score_ray(jobs, while_scoring)
        else:
            self.wait_ready()
            answers = self.pool.map(jobs, self.cfg.timeout_s, while_scoring)
        return self._collect(parts, answers, shown)

    def _score_ray(self, jobs: list[tuple], while_scoring: Callable[[], None] | None) -> list[tuple | JobFailure]:
        import ray

        owners = [i % len(self.actors) for i in range(len(jobs))]
        refs = [self.actors[a].score.remote(job) for a, job in zip(owners, jobs)]
        if while_scoring is not None:
            while_scoring()
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.cfg.timeout_s)
        late = JobFailure("timed_out", f"no answer within {self.cfg.timeout_s:g} s", None)
        answers = [_ray_result(r) if r in ready else late for r in refs]
        for a in sorted({a for a, r in zip(owners, answers) if isinstance(r, JobFailure)}):
            # a stuck or dead actor is replaced, so the next step has its full capacity
            ray.kill(self.actors[a], no_restart=True)
            self.actors[a] = self._actor_cls.remote(*self._actor_args)
        return answers

    def _collect(self, parts: list[slice], answers: list[tuple | JobFailure], prompts: list) -> ScoredChunks:
        scores: list[Scores] = [[] for _ in self.specs]
        failed, failures = [], []
        for part, answer in zip(parts, answers):
            size = part.stop - part.start
            failure = self._failure(part, answer, prompts)
            for f in range(len(self.specs)):
                scores[f] += [None] * size if failure is not None else answer[1][f]
            failed += [failure is not None] * size
            failures += [failure] if failure is not None else []
        return ScoredChunks(scores, failed, failures, len(parts))

    def _failure(self, part: slice, answer: tuple | JobFailure, prompts: list) -> ChunkFailure | None:
        """What failed in a chunk (None: it was scored); raises on unusable scores."""
        if isinstance(answer, JobFailure):
            kind, function, detail = answer.kind, answer.label or ", ".join(self.specs), answer.detail
        elif answer[0] == "error":
            raise RewardFunctionError(answer[1])
        elif answer[0] == "scores":
            return None
        else:
            kind, function, detail = answer[1]
        if kind == "out_of_memory":
            detail += f", past reward.memory_limit_mib = {self.cfg.memory_limit_mib} MiB"
        prompt = str(prompts[part.start])[:_PREVIEW]
        return ChunkFailure(kind, function, detail, part.start, part.stop - part.start, prompt)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.backend == "ray" and self.num_workers > 0:
            import ray

            for actor in self.actors:
                ray.kill(actor, no_restart=True)


def _builtin_inputs(prompts: list, completions: list, columns: dict[str, list], whole: bool) -> tuple[list, list, dict]:
    """All the built-in verifiers read: each completion's text (``whole``, for a step verifier: all of it, whose
    step ends are offsets in it; else its last ``TAIL_CHARS`` characters) and its reference's last ``TAIL_CHARS``."""
    texts = [completion_text(c) if whole else tail(completion_text(c)) for c in completions]
    answer = [tail(reference_text(a)) for a in columns.get("answer", [""] * len(texts))]
    return [None] * len(texts), texts, {"answer": answer}


def _ray_result(ref) -> tuple | JobFailure:
    import ray

    try:
        return ray.get(ref)
    except Exception as err:  # noqa: BLE001 - the actor died (a crash, os._exit, the memory limit): it is replaced
        return JobFailure("crashed", f"Ray: {type(err).__name__}: {str(err).splitlines()[0][:200]}", None)
