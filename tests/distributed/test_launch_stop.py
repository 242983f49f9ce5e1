"""A launcher stopped by SIGTERM (a container runtime, `timeout`) stops its spawned ranks: they are children of
multiprocessing's forkserver, not of the launcher, so without the launcher's handler they ran on after it died."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.killing import kill_group, rank_processes, settle

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = """
import sys
from dtppo.distributed.ranks import run_ranks
from tests.distributed.test_launch_stop import wait_forever
run_ranks(wait_forever, 2, sys.argv[1])
"""


def wait_forever(out_dir: str) -> None:
    """A rank that says it runs (the launcher then waits on it, its handler installed) and never finishes."""
    Path(out_dir, f"rank{os.environ['RANK']}.running").touch()
    time.sleep(600)


def test_sigterm_to_the_launcher_stops_its_ranks(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path)], cwd=REPO, env=env, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("rank*.running"))) < 2 and time.monotonic() < deadline:
            assert launcher.poll() is None, "the launcher ended before its ranks ran"
            time.sleep(0.2)
        assert len(rank_processes(launcher)) == 2
        launcher.send_signal(signal.SIGTERM)
        code = launcher.wait(timeout=60)
        assert settle(launcher.pid, 30) == 0, "processes of the run outlived the launcher"
        assert code == 128 + signal.SIGTERM  # the handler's exit, not death by the signal itself
    finally:
        kill_group(launcher)
