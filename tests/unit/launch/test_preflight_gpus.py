"""More ranks per node than GPUs is refused before any rank starts, in one line naming the key (CUDA stood in for):
each rank takes GPU LOCAL_RANK, and rank 1 of a one-GPU machine would otherwise end in a CUDA traceback."""

import pytest
import torch

from dtppo.config import ConfigError
from dtppo.launch.preflight import _check_launch
from tests.support.recipes import tiny_config


def _gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_more_local_ranks_than_gpus_is_one_config_error(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    _gpus(monkeypatch, 1)
    with pytest.raises(ConfigError) as refused:
        _check_launch(tiny_config("cluster.workers_per_node=2"))
    message = str(refused.value)
    assert message.startswith("cluster.workers_per_node: 2 ranks per node, but this machine has 1 GPU(s)")
    assert "\n" not in message
    _check_launch(tiny_config("cluster.workers_per_node=1"))  # one rank, one GPU
    _gpus(monkeypatch, 2)
    _check_launch(tiny_config("cluster.workers_per_node=2"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun's count of this node's ranks is the one that counts
    with pytest.raises(ConfigError, match="4 ranks per node"):
        _check_launch(tiny_config("cluster.workers_per_node=2"))


def test_cpu_runs_and_ray_are_not_limited_by_gpus(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    _gpus(monkeypatch, 0)
    _check_launch(tiny_config("cluster.workers_per_node=2"))  # CPU: ranks share the cores
    _gpus(monkeypatch, 1)
    _check_launch(tiny_config("cluster.workers_per_node=2", "cluster.backend=ray"))  # one GPU per actor, by Ray
