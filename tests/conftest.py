import os

import pytest
import torch

# Two cores: one intra-op thread per test process keeps timings and numerics stable.
torch.set_num_threads(int(os.environ.get("DTPPO_TEST_THREADS", "2")))

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(REPO), "shared")


@pytest.fixture
def repo_root() -> str:
    return REPO
