"""A rank's torch thread count: the machine's cores shared among its ranks, unless OMP_NUM_THREADS is set
(the vllm backend sets 1 on CPU and docs/design/generation.md says training then uses one thread too)."""

import os
import subprocess
import sys

import pytest

PROBE = """
import os, torch
from dtppo.distributed.ranks import _run_in_group
_run_in_group(lambda: print("threads", torch.get_num_threads()), ())
"""


def rank_threads(omp: str | None, local_world: int) -> int:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env |= {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "0",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": str(local_world),
        "CUDA_VISIBLE_DEVICES": "",
    }
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split("threads")[-1])


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores to tell the cases apart")
def test_explicit_omp_num_threads_is_kept_and_the_default_shares_the_cores():
    cores = os.cpu_count()
    assert rank_threads(None, 1) == cores
    assert rank_threads(None, 2) == max(1, cores // 2)
    assert rank_threads("1", 1) == 1  # before the fix: the machine's cores, whatever the user asked for
