"""Ray backend: same numbers as the local backend, ranks across two Ray nodes, a killed actor stops the run,
token authentication on a cluster dtppo attaches to."""

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.choice_task import choice_args
from tests.support.cli import read_jsonl, run_cli
from tests.support.recipes import FAST, TINY

ray = pytest.importorskip("ray")
RANK_MICRO = ["policy.train_micro_batch_size=2", "value.train_micro_batch_size=2"]
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}  # a private instance runs with its own random token (ray_launcher.py)
RAY_BIN = os.path.join(os.path.dirname(sys.executable), "ray")


def _args(sft_dir, name, steps, *extra):
    return [
        "ppo",
        TINY,
        *FAST,
        *RANK_MICRO,
        f"sft.output_dir={sft_dir}",
        f"ppo.max_num_steps={steps}",
        "ppo.validation.period=2",
        f"logger.log_dir={name}/log",
        f"checkpointing.checkpoint_dir={name}/ckpt",
        "checkpointing.save_period=1",
        *extra,
    ]


@pytest.fixture
def ray_tmp():
    """Ray's socket paths must stay under 107 bytes: a short directory, not pytest's tmp_path."""
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _comparable(record):
    return {k: v for k, v in record.items() if not k.startswith(("timing/", "perf/"))}


def _ray_processes(marker: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()


def test_one_rank_under_ray_is_the_local_run(choice_task, ray_tmp):
    """The Ray launcher in `make test`: one rank as a Ray actor (its scoring in a Ray actor too) trains exactly as
    the local process, on the task PPO learns fast (tests/support/choice_task.py), and leaves no Ray process."""
    root, files = choice_task
    steps = ["ppo.max_num_steps=2", "ppo.validation.period=2"]
    run_cli(choice_args(files, "ray_local", *steps), root)
    ray_args = ["cluster.backend=ray", "reward.num_workers=1", f"cluster.ray_temp_dir={ray_tmp}"]
    proc = run_cli(choice_args(files, "ray_actor", *steps, *ray_args), root)
    assert "ranks placed on Ray nodes: rank 0 ->" in proc.stdout
    local = [_comparable(r) for r in read_jsonl(root / "ray_local" / "metrics.jsonl")]
    remote = [_comparable(r) for r in read_jsonl(root / "ray_actor" / "metrics.jsonl")]
    assert [r["step"] for r in remote] == [1, 2] and [r.keys() for r in remote] == [r.keys() for r in local]
    # The same samples and rewards; the losses to float32 round-off: the actor computes with one thread (Ray gives
    # it one CPU), the local process with two, which sum in another order (2-rank runs, one thread a rank on both
    # sides, are equal bit for bit: the slow test below).
    for ray_record, local_record in zip(remote, local):
        assert ray_record["train/reward"] == local_record["train/reward"]
        assert ray_record == pytest.approx(local_record, rel=1e-5, abs=1e-6)
    assert not _ray_processes(ray_tmp) and not _ray_processes("ray::RayRank")  # clean shutdown


@pytest.mark.slow  # a Ray cluster start and two ranks; one rank under Ray in make test: the test above
def test_ray_backend_matches_local_backend(sft_dir, tmp_path, ray_tmp):
    token = Path.home() / ".ray" / "auth_token"
    token_before = token.stat().st_mtime if token.exists() else None
    run_cli(_args(sft_dir, "local", 2, "cluster.workers_per_node=2"), tmp_path)
    proc = run_cli(
        _args(
            sft_dir,
            "ray",
            2,
            "cluster.workers_per_node=2",
            "cluster.backend=ray",
            "reward.num_workers=2",
            f"cluster.ray_temp_dir={ray_tmp}",
        ),
        tmp_path,
    )
    assert "ranks placed on Ray nodes: rank 0 ->" in proc.stdout
    local = [_comparable(r) for r in read_jsonl(tmp_path / "local/log/metrics.jsonl")]
    remote = [_comparable(r) for r in read_jsonl(tmp_path / "ray/log/metrics.jsonl")]
    assert [r["step"] for r in remote] == [0, 1, 2] and remote == local
    assert (token.stat().st_mtime if token.exists() else None) == token_before  # no auth-token file written
    assert not _ray_processes(ray_tmp) and not _ray_processes("ray::RayRank")  # clean shutdown
    assert any(p.name.startswith("session_") for p in Path(ray_tmp).iterdir())  # session files stay there


def _token_env(token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return env | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0"}


@pytest.fixture
def token_cluster(ray_tmp, monkeypatch):
    """``start(num_nodes)``: a loopback cluster with token authentication, started as docs/guides/ray.md says, the
    token also in this test's environment (so dtppo runs get it); returns (address, token). Stopped after."""
    common = ["--num-cpus=1", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]

    def start(num_nodes: int) -> tuple[str, str]:
        token = secrets.token_hex(32)
        env = _token_env(token)
        port = 6400 + os.getpid() % 500
        subprocess.run(
            [
                RAY_BIN,
                "start",
                "--head",
                f"--port={port}",
                f"--temp-dir={ray_tmp}",
                "--include-dashboard=false",
                *common,
            ],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        for _ in range(num_nodes - 1):
            subprocess.run(
                [RAY_BIN, "start", f"--address=127.0.0.1:{port}", *common],
                env=env,
                check=True,
                capture_output=True,
                timeout=120,
            )
        for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_USAGE_STATS_ENABLED"):
            monkeypatch.setenv(key, env[key])
        return f"127.0.0.1:{port}", token

    try:
        yield start
    finally:
        _stop_cluster(ray_tmp)  # every node of this cluster keeps its session files under ray_tmp
        assert not _ray_processes(ray_tmp)


@pytest.mark.slow
def test_two_node_ray_cluster_places_a_rank_on_each_node(sft_dir, tmp_path, token_cluster):
    address, _ = token_cluster(num_nodes=2)
    proc = run_cli(
        _args(
            sft_dir,
            "two_nodes",
            2,
            "cluster.num_nodes=2",
            "cluster.workers_per_node=1",
            "cluster.backend=ray",
            f"cluster.ray_address={address}",
            "cluster.ray_placement=spread",
        ),
        tmp_path,
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("ranks placed on Ray nodes"))
    nodes = {part.split("->")[1].strip() for part in line.split(":", 1)[1].split(",")}
    assert len(nodes) == 2, line
    steps = [r["step"] for r in read_jsonl(tmp_path / "two_nodes/log/metrics.jsonl")]
    assert steps == [0, 1, 2]


@pytest.mark.slow
def test_killed_actor_stops_the_driver_and_the_last_checkpoint_loads(sft_dir, tmp_path, ray_tmp):
    args = _args(
        sft_dir, "killed", 50, "cluster.workers_per_node=2", "cluster.backend=ray", f"cluster.ray_temp_dir={ray_tmp}"
    )
    driver = subprocess.Popen(
        [sys.executable, "-m", "dtppo", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, **RAY_ENV),
    )
    ckpt = tmp_path / "killed" / "ckpt"
    deadline = time.monotonic() + 240
    while not (ckpt / "step_2").is_dir() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert (ckpt / "step_2").is_dir(), "no checkpoint appeared"
    pids = subprocess.run(["pgrep", "-f", "ray::RayRank"], capture_output=True, text=True).stdout.split()
    assert pids, "no rank actor process found"
    killed_at = time.monotonic()
    os.kill(int(pids[-1]), signal.SIGKILL)
    out, _ = driver.communicate(timeout=120)
    stopped_after = time.monotonic() - killed_at
    assert driver.returncode != 0 and stopped_after < 60, (driver.returncode, stopped_after)
    assert "rank " in out and "failed" in out, out[-2000:]
    # the latest complete checkpoint still loads (a single-process resume runs one more step from it)
    latest = max(int(p.name.split("_")[1]) for p in ckpt.iterdir() if p.name.startswith("step_"))
    resumed = run_cli(_args(sft_dir, "killed", latest + 1), tmp_path)
    assert "resumed from" in resumed.stdout and f"killed/ckpt/step_{latest}" in resumed.stdout


@pytest.mark.slow
def test_a_deliberate_stop_keeps_its_exit_code_under_ray(sft_dir, tmp_path, ray_tmp):
    # NaN losses from the first policy step on: every rank stops after the streak limit (3) with exit 3, and the
    # driver must exit 3 too, as a local run does, not with Ray's generic failure.
    args = _args(
        sft_dir, "nan", 4, "cluster.workers_per_node=2", "cluster.backend=ray", f"cluster.ray_temp_dir={ray_tmp}"
    )
    env = dict(os.environ, PYTHONUNBUFFERED="1", DTPPO_TEST_NONFINITE="policy:0,1,2,3,4,5,6,7", **RAY_ENV)
    proc = subprocess.run(
        [sys.executable, "-m", "dtppo", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out[-3000:]
    assert "consecutive optimizer steps had a non-finite loss or gradient" in out
    assert "Traceback" not in out


def _stop_cluster(temp_dir: str, grace_s: float = 3.0) -> None:
    """Stop the Ray processes of the cluster whose session files are under ``temp_dir``, and only those
    (``ray stop`` would also stop every other Ray instance of this user on the machine). Its daemons name
    ``temp_dir`` on their command line; the workers they spawn retitle themselves ``ray::...``, so they are
    found as the daemons' children."""
    daemons = [int(p) for p in _ray_processes(temp_dir)]
    children = [
        int(c)
        for p in daemons
        for c in subprocess.run(["pgrep", "-P", str(p)], capture_output=True, text=True).stdout.split()
    ]
    pids = children + daemons
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


_CONNECT = """
import sys, ray
try:
    ray.init(address=sys.argv[1], log_to_driver=False)
    print("ran", ray.get(ray.remote(lambda: 6 * 7).remote(), timeout=60))
except ConnectionError as err:
    print("refused:", err)
"""


@pytest.mark.slow  # a token-authenticated Ray cluster start
def test_token_auth_cluster_refuses_clients_without_the_token_and_runs_dtppo_with_it(sft_dir, tmp_path, token_cluster):
    address, _ = token_cluster(num_nodes=1)
    # No token anywhere (an empty HOME has no ~/.ray/auth_token), then a wrong one. A short GCS wait: the
    # refusal itself is immediate, Ray would only retry it for 20 s.
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    base |= {"HOME": str(tmp_path), "RAY_USAGE_STATS_ENABLED": "0", "RAY_gcs_server_port_wait_time_s": "2"}
    for extra in ({}, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}):
        probe = subprocess.run(
            [sys.executable, "-c", _CONNECT, address], env=base | extra, capture_output=True, text=True, timeout=120
        )
        assert probe.stdout.startswith("refused:"), probe.stdout + probe.stderr[-2000:]
        assert "InvalidAuthToken" in probe.stderr, probe.stderr[-2000:]  # refused for the token, not the network

    proc = run_cli(
        _args(
            sft_dir,
            "auth",
            2,
            "cluster.workers_per_node=1",
            "cluster.backend=ray",
            f"cluster.ray_address={address}",
            "ppo.validation.at_start=false",
        ),
        tmp_path,
    )
    assert "ranks placed on Ray nodes: rank 0 ->" in proc.stdout
    assert [r["step"] for r in read_jsonl(tmp_path / "auth/log/metrics.jsonl")] == [1, 2]


@pytest.mark.slow
def test_generation_ranks_as_their_own_actor_group_match_the_local_backend(sft_dir, tmp_path, ray_tmp):
    async_args = [
        "cluster.workers_per_node=2",
        "cluster.generation_ranks=1",
        "ppo.max_lag=1",
        "loss.rollout_correction.importance_sampling=token",
    ]
    run_cli(_args(sft_dir, "local_async", 2, *async_args), tmp_path)
    ray_args = ["cluster.backend=ray", f"cluster.ray_temp_dir={ray_tmp}"]
    proc = run_cli(_args(sft_dir, "ray_async", 2, *async_args, *ray_args), tmp_path)
    assert "generation: 1 generation rank(s)" in proc.stdout
    local = [_comparable(r) for r in read_jsonl(tmp_path / "local_async/log/metrics.jsonl")]
    remote = [_comparable(r) for r in read_jsonl(tmp_path / "ray_async/log/metrics.jsonl")]
    assert [r["step"] for r in remote] == [0, 1, 2] and remote == local
    assert [r["train/staleness/max"] for r in remote[1:]] == [0.0, 1.0]
    assert not _ray_processes(ray_tmp) and not _ray_processes("ray::RayRank")
