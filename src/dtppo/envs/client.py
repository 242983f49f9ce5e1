"""The environment as the episode loop sees it: batches of resets and steps, run in environment processes (a
``usercode.pool.ProcessPool`` of ``envs.worker.serve``) within ``env.timeout_s``, or in this process."""

from __future__ import annotations

from typing import Any

from dtppo.config import EnvConfig
from dtppo.config.reward_spec import parse_spec
from dtppo.envs.interface import EnvironmentFailure, Observation, load_environment, run_job
from dtppo.envs.worker import serve
from dtppo.usercode.pool import JobFailure, ProcessPool

STARTUP_S = 120.0  # longest wait for fresh environment processes to start (not counted in timeout_s)
MAX_CHUNK = 64  # episodes per job: bounds what one late job holds up


class EnvClient:
    """Resets and steps episodes of the environment ``cfg.class_`` names. The class is built here first, so a
    broken file or constructor is one line before any process starts (and a state of the file's own classes can
    be read back here)."""

    def __init__(self, cfg: EnvConfig):
        self.spec, self.kwargs, self.timeout_s = parse_spec(cfg.class_).absolute(), dict(cfg.kwargs), cfg.timeout_s
        self.env = load_environment(self.spec, self.kwargs)
        self.pool = None
        if cfg.num_workers > 0:
            args = (self.spec, self.kwargs, cfg.memory_limit_mib, cfg.max_print_bytes)
            self.pool = ProcessPool(cfg.num_workers, serve, args, "dtppo-env")
            self.pool.wait_ready(STARTUP_S)

    def reset(self, rows: list[dict[str, Any]], ids: list[int]) -> list[Any]:
        """Each episode's initial state. rows: ``interface.episode_row`` of each; ids: the samples' indices."""
        return self._run("reset", ids, rows)

    def step(self, states: list[Any], texts: list[str], ids: list[int]) -> list[tuple[Any, Observation, float, bool]]:
        """(state after the step, observation, reward, done) for each episode's assistant turn ``texts``."""
        return self._run("step", ids, states, texts)

    def _run(self, kind: str, ids: list[int], *columns: list) -> list:
        if not ids:
            return []
        if self.pool is None:
            return _answer(run_job(self.spec, self.env, (kind, ids, *columns)))
        size = min(MAX_CHUNK, -(-len(ids) // len(self.pool.workers)))
        starts = range(0, len(ids), size)
        jobs = [(kind, ids[i : i + size], *(c[i : i + size] for c in columns)) for i in starts]
        out = []
        for job, answer in zip(jobs, self.pool.map(jobs, self.timeout_s)):
            if isinstance(answer, JobFailure):
                what = (
                    f"its process died twice ({answer.detail})"
                    if answer.kind == "crashed"
                    else f"no answer within env.timeout_s = {self.timeout_s:g} s"
                )
                raise EnvironmentFailure(
                    f"environment {self.spec!r}: {answer.kind.replace('_', ' ')} on the {kind} of samples "
                    f"{job[1][0]}..{job[1][-1]}: {what}"
                )
            out += _answer(answer)
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def _answer(answer: tuple[str, Any]) -> list:
    kind, payload = answer
    if kind == "error":
        raise EnvironmentFailure(payload)
    return payload
