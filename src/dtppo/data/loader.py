"""Training and validation sources for a run's data section, and a resumable prompt loader."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

from transformers import PreTrainedTokenizerBase

from dtppo.config import DataConfig, DatasetConfig
from dtppo.data.chat import ChatFormat, prompt_length
from dtppo.data.formats import row_format
from dtppo.data.problem import Problem
from dtppo.data.rows import DataError, RowFormat, RowRules, collect_rows, read_jsonl
from dtppo.data.tiny_math import TinyMathStream, validation_set

DatasetRows = tuple[Iterable[Mapping] | None, Iterable[Mapping] | None]  # (training, validation) rows, None: the file


class ProblemSource(Protocol):
    def __getitem__(self, index: int) -> Problem: ...


class PromptLoader:
    """Yields batches of problems; its whole position is ``state_dict()`` so a resume continues exactly.

    A finite list is walked in a fresh seeded permutation each epoch; an unlimited stream in index order.
    """

    def __init__(self, source: ProblemSource | list[Problem], seed: int):
        self.source, self.seed = source, seed
        self.epoch, self.offset = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> list[int] | None:
        if not isinstance(self.source, list):
            return None
        order = list(range(len(self.source)))
        random.Random(self.seed * 7919 + self.epoch).shuffle(order)
        return order

    def next_batch(self, size: int) -> list[Problem]:
        batch = []
        for _ in range(size):
            if self._order is None:
                batch.append(self.source[self.offset])
            else:
                if self.offset == len(self._order):
                    self.epoch, self.offset = self.epoch + 1, 0
                    self._order = self._permutation()
                batch.append(self.source[self._order[self.offset]])
            self.offset += 1
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self._order = self._permutation()


def build_sources(
    data: DataConfig,
    seed: int,
    max_validation: int,
    careless_fraction: float = 0.0,
    tokenizer: PreTrainedTokenizerBase | None = None,
    rows: DatasetRows = (None, None),
) -> tuple[ProblemSource | list[Problem], list[Problem]]:
    """(training source, at most ``max_validation`` validation problems) for ``data``; ``seed`` orders a generated
    task's stream. With ``tokenizer``, rows whose prompt exceeds ``data.max_prompt_tokens`` are bad rows (skipped or
    refused per ``data.on_bad_row``). ``rows``: in-memory (training, validation) rows that replace ``data.train`` and
    ``data.validation`` (a ``datasets.Dataset`` or a list of dicts; None: the config's source)."""
    if data.task != "tiny_math":
        rules = RowRules(
            data.on_bad_row,
            data.max_prompt_tokens,
            None if tokenizer is None else prompt_length(tokenizer, ChatFormat.of(data)),
        )
        fmt = row_format(data)
        keys = ("data.train", "data.validation")
        train, validation = (
            load_problems(key, source, fmt, limit, rules)
            if given is None
            else given_problems(key, given, fmt, limit, rules)
            for key, source, given, limit in zip(keys, (data.train, data.validation), rows, (None, max_validation))
        )
        return train, validation
    if any(given is not None for given in rows):
        raise DataError("data.task: tiny_math generates its problems; in-memory rows need gsm8k, math or custom")
    validation = validation_set(data.tiny_math, max_validation)
    exclude = {p.question for p in validation}
    return TinyMathStream(data.tiny_math, seed, careless_fraction, exclude), validation


def given_problems(
    key: str, rows: Iterable[Mapping], fmt: RowFormat, limit: int | None, rules: RowRules
) -> list[Problem]:
    """The usable problems of in-memory rows that stand for config key ``key`` (a row is named ``<key> row <i>``)."""
    return collect_rows(
        ((f"{key} row {i}", row) for i, row in enumerate(rows)), f"{key} (in memory)", fmt, limit, rules
    )[0]


def load_problems(key: str, source: DatasetConfig, fmt: RowFormat, limit: int | None, rules: RowRules) -> list[Problem]:
    """The usable problems of a jsonl file or an HF dataset (config key ``key``, e.g. ``data.train``)."""
    if source.path is None:
        raise DataError(f"{key}.path: required when data.task is not tiny_math (or rows given in Python)")
    if Path(source.path).is_file():
        return read_jsonl(source.path, fmt, limit, rules)[0]
    from dtppo.data.hf import read_hf

    return read_hf(key, source, fmt, limit, rules)[0]
