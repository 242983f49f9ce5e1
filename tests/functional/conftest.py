"""Fixtures of the end-to-end tests (the CLI runs in a subprocess, in a temporary working directory; the helpers
are tests.support.cli's)."""

import pytest

from tests.support.choice_task import write_choice_task
from tests.support.cli import run_cli
from tests.support.recipes import TINY


@pytest.fixture(scope="session")
def sft_dir(tmp_path_factory):
    """A briefly fine-tuned tiny policy (60 steps), shared by the PPO tests that need a sane start."""
    root = tmp_path_factory.mktemp("sft")
    run_cli(
        [
            "sft",
            TINY,
            "sft.num_steps=60",
            "sft.careless_stage.num_steps=0",
            f"sft.output_dir={root / 'model'}",
            "ppo.validation.max_samples=32",
            "logger.tensorboard=false",
        ],
        cwd=root,
    )
    return root / "model"


@pytest.fixture(scope="session")
def choice_task(tmp_path_factory):
    """(the working directory, the files) of the task PPO learns in a few steps (tests/support/choice_task.py)."""
    root = tmp_path_factory.mktemp("choice")
    return root, write_choice_task(root)
