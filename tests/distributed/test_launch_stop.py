"""A launcher stopped by SIGTERM (a container runtime, `timeout`) stops its spawned ranks: they are children of
multiprocessing's forkserver, not of the launcher, so without the launcher's handler they ran on after it died."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = """
import sys
from dtppo.distributed.launch import run_ranks
from tests.distributed.test_launch_stop import wait_forever
run_ranks(wait_forever, 2, sys.argv[1])
"""


def wait_forever(out_dir: str) -> None:
    """A rank that announces its pid and then never finishes."""
    Path(out_dir, f"rank{os.environ['RANK']}.pid").write_text(str(os.getpid()))
    time.sleep(600)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def test_sigterm_to_the_launcher_stops_its_ranks(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)], cwd=REPO, env=env)
    pid_files = [tmp_path / "rank0.pid", tmp_path / "rank1.pid"]
    try:
        assert wait_until(lambda: all(f.is_file() and f.read_text() for f in pid_files), 120), "ranks never started"
        ranks = [int(f.read_text()) for f in pid_files]
        assert all(alive(pid) for pid in ranks)
        launcher.send_signal(signal.SIGTERM)
        code = launcher.wait(timeout=60)
        assert wait_until(lambda: not any(alive(pid) for pid in ranks), 30), f"ranks {ranks} outlived the launcher"
        assert code == 128 + signal.SIGTERM  # the handler's exit, not death by the signal itself
    finally:
        launcher.kill()
        for f in pid_files:
            if f.is_file() and f.read_text():
                try:
                    os.kill(int(f.read_text()), signal.SIGKILL)
                except ProcessLookupError:
                    pass
