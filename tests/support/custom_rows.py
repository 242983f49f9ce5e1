"""Rows of a custom task written to a jsonl file, and a config that reads them: what the data tests share."""

from __future__ import annotations

import json
from pathlib import Path

from dtppo import config as config_lib
from tests.support.recipes import REPO

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say 7."}]


def write_rows(path: Path, rows: list) -> Path:
    """``rows`` (dicts, or raw lines as strings) as a jsonl file at ``path``."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def custom_config(path: Path, *extra: str) -> config_lib.Config:
    """The base recipe on ``data.task=custom`` with ``path`` as its train and validation rows."""
    return config_lib.load(
        REPO / "recipes/base.yaml",
        [
            "data.task=custom",
            f"data.train.path={path}",
            f"data.validation.path={path}",
            "reward.functions=[gsm8k]",
            *extra,
        ],
    )
