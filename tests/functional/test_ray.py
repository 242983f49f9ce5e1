"""Ray backend: same numbers as the local backend, ranks across two Ray nodes, a killed actor stops the run."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAST, TINY, read_jsonl, run_cli

ray = pytest.importorskip("ray")
RANK_MICRO = ["policy.train_micro_batch_size=2", "value.train_micro_batch_size=2"]
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def _args(sft_dir, name, steps, *extra):
    return ["ppo", TINY, *FAST, *RANK_MICRO, f"sft.output_dir={sft_dir}", f"ppo.max_num_steps={steps}",
            "ppo.val_period=2", f"logger.log_dir={name}/log", f"checkpointing.checkpoint_dir={name}/ckpt",
            "checkpointing.save_period=1", *extra]


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


def test_ray_backend_matches_local_backend(sft_dir, tmp_path, ray_tmp):
    token = Path.home() / ".ray" / "auth_token"
    token_before = token.stat().st_mtime if token.exists() else None
    run_cli(_args(sft_dir, "local", 2, "cluster.workers_per_node=2"), tmp_path)
    proc = run_cli(_args(sft_dir, "ray", 2, "cluster.workers_per_node=2", "cluster.backend=ray", "reward.num_workers=2",
                         f"cluster.ray_temp_dir={ray_tmp}"), tmp_path)
    assert "ranks placed on Ray nodes: rank 0 ->" in proc.stdout
    local = [_comparable(r) for r in read_jsonl(tmp_path / "local/log/metrics.jsonl")]
    remote = [_comparable(r) for r in read_jsonl(tmp_path / "ray/log/metrics.jsonl")]
    assert [r["step"] for r in remote] == [0, 1, 2] and remote == local
    assert (token.stat().st_mtime if token.exists() else None) == token_before  # no auth-token file written
    assert not _ray_processes(ray_tmp) and not _ray_processes("ray::RayRank")  # clean shutdown
    assert any(p.name.startswith("session_") for p in Path(ray_tmp).iterdir())  # session files stay there


@pytest.fixture
def two_node_cluster(ray_tmp):
    env = dict(os.environ, **RAY_ENV)
    port = 6400 + os.getpid() % 500
    common = ["--num-cpus=1", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    subprocess.run([ray_bin, "start", "--head", f"--port={port}", f"--temp-dir={ray_tmp}",
                    "--include-dashboard=false", *common], env=env, check=True, capture_output=True, timeout=120)
    try:
        subprocess.run([ray_bin, "start", f"--address=127.0.0.1:{port}", *common], env=env, check=True,
                       capture_output=True, timeout=120)
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True, timeout=120)


def test_two_node_ray_cluster_places_a_rank_on_each_node(sft_dir, tmp_path, two_node_cluster):
    proc = run_cli(_args(sft_dir, "two_nodes", 2, "cluster.num_nodes=2", "cluster.workers_per_node=1",
                         "cluster.backend=ray", f"cluster.ray_address={two_node_cluster}",
                         "cluster.ray_placement=spread"), tmp_path)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("ranks placed on Ray nodes"))
    nodes = {part.split("->")[1].strip() for part in line.split(":", 1)[1].split(",")}
    assert len(nodes) == 2, line
    steps = [r["step"] for r in read_jsonl(tmp_path / "two_nodes/log/metrics.jsonl")]
    assert steps == [0, 1, 2]


def test_killed_actor_stops_the_driver_and_the_last_checkpoint_loads(sft_dir, tmp_path, ray_tmp):
    args = _args(sft_dir, "killed", 50, "cluster.workers_per_node=2", "cluster.backend=ray",
                 f"cluster.ray_temp_dir={ray_tmp}")
    driver = subprocess.Popen([sys.executable, "-m", "dtppo", *args], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=dict(os.environ, **RAY_ENV))
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


def test_a_deliberate_stop_keeps_its_exit_code_under_ray(sft_dir, tmp_path, ray_tmp):
    # NaN losses from the first policy step on: every rank stops after the streak limit (3) with exit 3, and the
    # driver must exit 3 too, as a local run does, not with Ray's generic failure.
    args = _args(sft_dir, "nan", 4, "cluster.workers_per_node=2", "cluster.backend=ray",
                 f"cluster.ray_temp_dir={ray_tmp}")
    env = dict(os.environ, PYTHONUNBUFFERED="1", DTPPO_TEST_NONFINITE="policy:0,1,2,3,4,5,6,7", **RAY_ENV)
    proc = subprocess.run([sys.executable, "-m", "dtppo", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out[-3000:]
    assert "consecutive optimizer steps had a non-finite loss or gradient" in out
    assert "Traceback" not in out
