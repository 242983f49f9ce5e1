"""User code that fails badly, through the scoring pool, in this process, through Ray scoring actors and in environment
processes: each failure is named by its kind (a crash with its exit code or signal, a timeout, an exception, memory),
fails its own chunk in bounded time, leaves the pool whole and nothing running, and cannot take this process's memory
or flood its output (docs/guides/reliability.md, "User code that fails badly")."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from dtppo.config import EnvConfig, RewardConfig
from dtppo.data.problem import Problem
from dtppo.envs.client import EnvClient
from dtppo.envs.interface import EnvironmentFailure
from dtppo.rewards.rewarder import Rewarder
from dtppo.rewards.scoring import RewardScorer, ScoredChunks
from tests.support.recipes import REPO

FUNCTIONS = REPO / "tests" / "support" / "failing_functions.py"
ENV = REPO / "tests" / "support" / "scripted_env.py"
PROMPTS = [f"p{i}" for i in range(8)]  # two chunks of four over two processes
LIMIT_MIB = 256
PRINT_BYTES = 1000


def _scorer(name: str, backend: str = "local", **bounds) -> RewardScorer:
    cfg = RewardConfig(num_workers=2, timeout_s=3.0, memory_limit_mib=LIMIT_MIB, max_print_bytes=PRINT_BYTES)
    cfg = RewardConfig(**{**cfg.__dict__, **bounds})
    scorer = RewardScorer(cfg, backend, [f"{FUNCTIONS}:{name}"])
    scorer.wait_ready()
    return scorer


def _score(scorer: RewardScorer) -> ScoredChunks:
    return scorer.score(PROMPTS, ["c"] * len(PROMPTS), {})


def _group_members(pgids: set[int]) -> list[int]:
    """Live processes in the process groups ``pgids`` (what a pool process and its forks leave behind)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) in pgids and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def _rss_mib() -> float:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


CASES = [
    ("exits", "crashed", r"crashed \(its process died: exit code 3\)"),
    ("segfault", "crashed", r"crashed \(its process died: signal 11 \(SIGSEGV\)\)"),
    (
        "allocates",
        "out_of_memory",
        rf"ran out of memory \(MemoryError, past reward.memory_limit_mib = {LIMIT_MIB} MiB\)",
    ),
    ("forks_and_exits", "crashed", r"crashed \(its process died: exit code 0\)"),
    ("hangs", "timed_out", r"timed out \(no answer within 3 s\)"),
]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("name, kind, line", CASES, ids=[c[0] for c in CASES])
def test_a_failing_function_fails_its_chunks_named_and_the_pool_is_replaced(name, kind, line):
    scorer = _scorer(name)
    try:
        before, rss = scorer.pool.worker_pids, _rss_mib()
        start = time.monotonic()
        scored = _score(scorer)
        elapsed = time.monotonic() - start
        assert elapsed < 3.0 + 5.0  # the time bound (the hang), then killing and replacing processes
        assert _rss_mib() - rss < 64  # an allocation past the limit happened in the scoring process, not here
        assert scored.failed == [True] * 8 and scored.scores == [[None] * 8] and scored.chunks == 2
        assert [(f.kind, f.first, f.size) for f in scored.failures] == [(kind, 0, 4), (kind, 4, 4)]
        assert re.search(
            rf"'{re.escape(str(FUNCTIONS))}:{name}' {line} on samples 4..7 \(prompt 'p4'\)$",
            scored.failures[1].describe(),
        )
        scorer.wait_ready()
        after = scorer.pool.worker_pids
        if kind == "out_of_memory":  # the MemoryError freed what it held: the processes go on
            assert after == before
        else:  # dead or stuck: both replaced, the pool whole, nothing the old processes forked left running
            assert len(after) == 2 and set(after).isdisjoint(before)
            assert _group_members(set(before)) == []
    finally:
        scorer.close()


def test_the_memory_limit_is_what_fails_the_allocation(monkeypatch):
    monkeypatch.setenv("ALLOC_MIB", "512")  # spawned scoring processes inherit it
    for limit, failed in [(LIMIT_MIB, True), (1024, False)]:
        scorer = _scorer("allocates", memory_limit_mib=limit)
        try:
            scored = _score(scorer)
        finally:
            scorer.close()
        assert scored.failed == [failed] * 8
        assert scored.scores == [[None if failed else 8.0] * 8]  # 8 blocks of 64 MiB held under 1 GiB


def test_a_function_that_forks_answers_once_per_chunk():
    """Both copies return from the fork; only the scoring process answers, so the next chunks' answers stay theirs."""
    scorer = _scorer("forks_and_returns")
    try:
        pids = scorer.pool.worker_pids
        for _ in range(3):
            scored = _score(scorer)
            assert scored.failures == [] and scored.scores == [[1.0] * 8]
        assert scorer.pool.worker_pids == pids
    finally:
        scorer.close()


def test_what_a_function_prints_is_capped_per_chunk(capfd):
    scorer = _scorer("chatty")
    try:
        capfd.readouterr()
        for _ in range(2):
            scored = _score(scorer)
            assert scored.failures == [] and scored.scores == [[1.0] * 8]
        time.sleep(0.5)  # the processes' drain threads pass on what is left
        out, err = capfd.readouterr()
    finally:
        scorer.close()
    notice = "[dtppo: reward function output (reward.max_print_bytes) past 1000 bytes in this job is dropped]"
    # 4 chunks, each printing 3 MB: at most the allowance and one notice each reach the log
    assert out.count(notice) + err.count(notice) == 4
    assert len(out) + len(err) <= 4 * (PRINT_BYTES + len(notice) + 2)
    assert out.count("x" * 99) >= 4  # the allowance itself passes


def test_in_this_process_a_raise_fails_its_chunk_too(tmp_path, monkeypatch):
    counter = tmp_path / "calls"
    counter.write_bytes(b"." * 9)  # the next call is the 10th
    monkeypatch.setenv("FLAKY_COUNTER", str(counter))
    scorer = RewardScorer(RewardConfig(num_workers=0), "local", [f"{FUNCTIONS}:flaky"])
    first, second = _score(scorer), _score(scorer)
    assert [f.kind for f in first.failures] == ["raised"] and first.failed == [True] * 8
    assert "raised ConnectionError: sandbox dropped request 10 on samples 0..7" in first.failures[0].describe()
    assert second.failures == [] and second.failed == [False] * 8


def test_a_reward_of_zero_is_a_score_not_a_failure():
    reward = RewardConfig(functions=(f"{FUNCTIONS}:zeros",), weights=(1.0,), num_workers=2, max_failed_fraction=0.0)
    rewarder = Rewarder(reward, system_prompt=None, backend="local", device=None)
    problems = [Problem(question=p, solution="", answer=None) for p in PROMPTS]
    try:
        for step in range(3):
            scored = rewarder.score(problems, ["c"] * len(problems))
            assert scored.total.tolist() == [0.0] * 8 and not scored.failed.any()
            assert scored.means()["zeros"] == 0.0 and scored.means()["failed_samples"] == 0
            assert rewarder.budget.end_step(last=step == 2) is None  # even a budget of 0 failures is not spent
    finally:
        rewarder.close()


ENV_CASES = [
    (
        "Segfaults",
        r"Segfaults'?: crashed on the step of samples 3..3: its process died twice \(signal 11 \(SIGSEGV\)\)",
    ),
    ("Hoards", r"Hoards'?: step raised MemoryError.* \(out of memory: env.memory_limit_mib\) \(sample 3\)"),
]


@pytest.mark.parametrize("name, message", ENV_CASES, ids=[c[0] for c in ENV_CASES])
def test_an_environment_that_crashes_or_hoards_is_named_and_bounded(name, message):
    env = EnvClient(EnvConfig(class_=f"{ENV}:{name}", num_workers=1, timeout_s=10.0, memory_limit_mib=LIMIT_MIB))
    try:
        states = env.reset([{}], [3])
        rss = _rss_mib()
        with pytest.raises(EnvironmentFailure, match=message):
            env.step(states, ["x"], [3])
        assert _rss_mib() - rss < 64
    finally:
        env.close()


def test_what_an_environment_prints_is_capped_per_job(capfd):
    env = EnvClient(EnvConfig(class_=f"{ENV}:Chatty", num_workers=1, max_print_bytes=PRINT_BYTES))
    try:
        states = env.reset([{}], [0])
        capfd.readouterr()
        assert [a[2:] for a in env.step(states, ["x"], [0])] == [(0.0, True)]
        time.sleep(0.5)
        out, err = capfd.readouterr()
    finally:
        env.close()
    assert out.count("z") == PRINT_BYTES and "environment output (env.max_print_bytes) past 1000 bytes" in out


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    import tempfile

    ray.init(num_cpus=1, include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    yield
    ray.shutdown()


@pytest.mark.parametrize(
    "name, kind, line",
    [
        ("exits", "crashed", r"crashed \(its process died: Ray: ActorDiedError"),
        ("allocates", "out_of_memory", r"ran out of memory \(MemoryError, past reward.memory_limit_mib = 256 MiB\)"),
    ],
)
@pytest.mark.slow  # a Ray session; the same bounds on local scoring processes: the tests above
def test_ray_scoring_actors_are_bounded_and_replaced(ray_session, name, kind, line):
    scorer = _scorer(name, backend="ray")
    ok = _scorer("ok", backend="ray")
    try:
        scored = _score(scorer)
        assert scored.failed == [True] * 8 and [f.kind for f in scored.failures] == [kind, kind]
        assert re.search(line, scored.failures[0].describe())
        assert _score(ok).scores == [[1.0] * 8]  # the actors' bounds leave a function within them alone
        assert [f.kind for f in _score(scorer).failures] == [kind, kind]  # replaced actors, the same verdict
    finally:
        scorer.close()
        ok.close()
