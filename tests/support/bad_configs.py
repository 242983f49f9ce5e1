"""What the config tests share: a recipe override is refused, before any compute, with its key named first."""

from __future__ import annotations

import pytest

from dtppo import config as config_lib
from dtppo.config import ConfigError
from dtppo.launch.preflight import preflight
from tests.support.recipes import REPO, TINY

GSM8K = [
    "data.task=gsm8k",
    f"data.train.path={REPO / 'tests/data/gsm8k/train.jsonl'}",
    f"data.validation.path={REPO / 'tests/data/gsm8k/test.jsonl'}",
]


def assert_refused(kind: str, overrides: list[str], key: str) -> None:
    """``overrides`` on the tiny recipe are refused by ``load`` or ``preflight`` with a message opening ``key:``."""
    with pytest.raises(ConfigError) as err:
        preflight(config_lib.load(TINY, overrides))
    assert str(err.value).startswith(key + ":"), f"{kind}: {err.value}"


def ids(table: list[tuple]) -> list[str]:
    return [" ".join(overrides) for _, overrides, _ in table]
