"""Prompt rows from Hugging Face ``datasets``: a directory written by ``save_to_disk``, or a hub dataset id.

``datasets`` is imported only here, when a recipe names such a source (``pip install 'dtppo[hf]'``). Rows go
through the same parsing and bad-row policy as jsonl lines (``rows.collect_rows``); a row is located as
``<path>[<split>] row <index>``. Any failure to open the source (a hub id without network, an unknown config
or split) is one ``DataError`` naming the key. Without network the hub client gives up after its retries
(~25 s); with ``HF_HUB_OFFLINE=1`` / ``HF_DATASETS_OFFLINE=1`` it fails at once.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dtppo.config import DatasetConfig
from dtppo.data.problem import Problem
from dtppo.data.rows import DataError, RowFormat, RowRules, collect_rows


def read_hf(
    key: str, source: DatasetConfig, fmt: RowFormat, limit: int | None, rules: RowRules
) -> tuple[list[Problem], collections.Counter]:
    """(usable problems, bad-row count per reason) of the HF dataset ``source`` names (config key ``key``,
    e.g. ``data.train``), read in ``fmt``."""
    dataset = _open(key, source)
    needed = [c for c in (fmt.prompt_key, fmt.answer_key) if c is not None]
    missing = [c for c in needed if c not in dataset.column_names]
    if missing:
        raise DataError(
            f"{key}.path: {source.path} has no column {missing[0]!r} (columns: "
            f"{dataset.column_names}); {fmt.name} rows need {needed}"
        )
    where = f"{source.path}[{source.split}]" if source.split else source.path
    return collect_rows(_rows(dataset, where), where, fmt, limit, rules)


def _rows(dataset: Any, where: str) -> Iterator[tuple[str, dict]]:
    for index, row in enumerate(dataset):
        yield f"{where} row {index}", row


@contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """Errors only from ``logger_name`` meanwhile: without network the hub client retries 5 times over ~25 s
    and warns on each, and the one line we raise afterwards says it all."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _open(key: str, source: DatasetConfig) -> Any:
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{key}.path: {source.path} is an HF dataset and needs the datasets package: pip install 'dtppo[hf]'"
        ) from None
    datasets.disable_progress_bars()
    try:
        if Path(source.path).is_dir():
            loaded = datasets.load_from_disk(source.path)
            return loaded[source.split] if source.split is not None else loaded
        with _quiet("huggingface_hub"):
            return datasets.load_dataset(source.path, source.hf_config, split=source.split)
    # The library's failures have many types (network, cache, unknown config or split): each becomes one line.
    except Exception as err:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise DataError(
            f"{key}.path: cannot load the HF dataset {source.path} (hf_config {source.hf_config}, "
            f"split {source.split}): {type(err).__name__}: {detail}"
        ) from None
