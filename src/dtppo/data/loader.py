"""Training and validation sources for a config, a resumable prompt loader, and prompt formatting."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Protocol

from transformers import PreTrainedTokenizerBase

from dtppo.config import Config, DataConfig, DatasetConfig
from dtppo.data.chat import ChatFormat
from dtppo.data.formats import row_format
from dtppo.data.problem import Problem, Prompt
from dtppo.data.rows import RowFormat, RowRules, read_jsonl
from dtppo.data.tiny_math import TinyMathStream, validation_set


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
    cfg: Config,
    careless_fraction: float = 0.0,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> tuple[ProblemSource | list[Problem], list[Problem]]:
    """(training source, validation problems) for ``cfg.data``. With ``tokenizer``, rows whose prompt exceeds
    ``data.max_prompt_tokens`` are bad rows (skipped or refused per ``data.on_bad_row``)."""
    data = cfg.data
    if data.task != "tiny_math":
        rules = RowRules(
            data.on_bad_row,
            data.max_prompt_tokens,
            None if tokenizer is None else _prompt_length(tokenizer, ChatFormat.of(data)),
        )
        fmt = row_format(data)
        return (
            load_problems("data.train", data.train, fmt, None, rules),
            load_problems("data.validation", data.validation, fmt, cfg.ppo.max_val_samples, rules),
        )
    validation = validation_set(data.tiny_math, cfg.ppo.max_val_samples)
    exclude = {p.question for p in validation}
    return TinyMathStream(data.tiny_math, cfg.ppo.seed, careless_fraction, exclude), validation


def load_problems(key: str, source: DatasetConfig, fmt: RowFormat, limit: int | None, rules: RowRules) -> list[Problem]:
    """The usable problems of a jsonl file or an HF dataset (config key ``key``, e.g. ``data.train``)."""
    if Path(source.path).is_file():
        return read_jsonl(source.path, fmt, limit, rules)[0]
    from dtppo.data.hf import read_hf

    return read_hf(key, source, fmt, limit, rules)[0]


def _prompt_length(tokenizer: PreTrainedTokenizerBase, chat: ChatFormat):
    """Tokens of a prompt, counted exactly as ``encode_prompts`` encodes it."""

    def length(prompt: Prompt) -> int:
        text = format_prompt(tokenizer, prompt, chat)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return length


def conversation(prompt: Prompt, system_prompt: str | None) -> list[dict[str, str]]:
    """The prompt as chat messages: a text prompt is the user turn; ``system_prompt`` goes first unless the
    messages bring their own system turn."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def format_prompt(tokenizer: PreTrainedTokenizerBase, prompt: Prompt, chat: ChatFormat) -> str:
    """The prompt text through the tokenizer's chat template (ours or the model's), with ``chat``'s system prompt
    and template variables, ending with the generation prompt."""
    return chat.render(tokenizer, conversation(prompt, chat.system_prompt), add_generation_prompt=True)


def encode_prompts(tokenizer: PreTrainedTokenizerBase, problems: list[Problem], data: DataConfig) -> list[list[int]]:
    """Token ids of each prompt, rendered as ``data`` says (``system_prompt``, ``chat_template_kwargs``); a prompt
    over ``data.max_prompt_tokens`` keeps its last ``max_prompt_tokens`` tokens."""
    chat = ChatFormat.of(data)
    texts = [format_prompt(tokenizer, p.question, chat) for p in problems]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [row[-data.max_prompt_tokens :] for row in ids]
