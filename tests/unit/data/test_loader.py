"""The sources of a run and its resumable prompt loader (``dtppo.data.loader``): a finite list walked in a fresh
seeded permutation each epoch, a stream in index order, the position whole in ``state_dict``; file-backed sources
built from the data section with the prompt-length rule, and the generated task's validation kept out of its
training stream."""

from __future__ import annotations

import json

import pytest

from dtppo.config import DataConfig, TinyMathConfig
from dtppo.data.chat import encode_prompts
from dtppo.data.loader import PromptLoader, build_sources
from dtppo.data.rows import DataError
from dtppo.data.tiny_math import TinyMathStream
from dtppo.models.tokenizer import load_tokenizer
from tests.support.recipes import REPO, tiny_config


def test_prompt_loader_resumes_exactly():
    items = list(range(10))
    a = PromptLoader(items, seed=1)
    first = a.next_batch(7) + a.next_batch(7)
    assert sorted(first[:10]) == items  # one full epoch before repeating
    b = PromptLoader(items, seed=1)
    b.next_batch(7)
    c = PromptLoader(items, seed=1)
    c.load_state_dict(b.state_dict())
    assert c.next_batch(7) == first[7:]


def test_each_epoch_is_a_new_permutation_and_a_stream_goes_in_order():
    items = list(range(6))
    loader = PromptLoader(items, seed=5)
    epochs = [loader.next_batch(6) for _ in range(3)]
    assert all(sorted(e) == items for e in epochs) and len({tuple(e) for e in epochs}) > 1
    assert loader.state_dict() == {"epoch": 2, "offset": 6}
    assert PromptLoader(items, seed=5).next_batch(6) == epochs[0]  # the seed decides
    stream = TinyMathStream(TinyMathConfig(), seed=1)
    in_order = PromptLoader(stream, seed=99)
    assert in_order.next_batch(3) == [stream[0], stream[1], stream[2]] and in_order.state_dict()["offset"] == 3


def test_the_generated_task_keeps_its_validation_out_of_training():
    train, validation = build_sources(DataConfig(), seed=3, max_validation=40)
    assert isinstance(train, TinyMathStream) and len(validation) == 40
    asked = {p.question for p in validation}
    assert not any(train[i].question in asked for i in range(500))


LONG_QUESTION = "How many apples? " * 40  # 680 characters: over a 200-token limit with a character tokenizer
ROWS = [
    {"question": "Tom has 2 apples and buys 3. How many?", "answer": "2 + 3 = 5\n#### 5"},
    {"question": LONG_QUESTION, "answer": "#### 1"},
    {"question": "Q without answer"},
    {"question": "A short one", "answer": "#### -3.5"},
]


def test_build_sources_applies_the_config_and_the_prompt_limit(tmp_path, monkeypatch):
    """Through the config, with the tokenizer the trainer uses: the prompt limit counts chat-template tokens."""
    monkeypatch.chdir(REPO)
    data_file = tmp_path / "rows.jsonl"
    data_file.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    tokenizer = load_tokenizer(None)
    overrides = [
        "data.task=gsm8k",
        f"data.train.path={data_file}",
        f"data.validation.path={data_file}",
        "data.max_prompt_tokens=200",
    ]
    cfg = tiny_config(*overrides)
    train, validation = build_sources(cfg.data, cfg.ppo.seed, cfg.ppo.validation.max_samples, tokenizer=tokenizer)
    assert [(p.question, p.answer) for p in train] == [(ROWS[0]["question"], "5"), ("A short one", "-3.5")]
    assert validation == train
    assert max(len(ids) for ids in encode_prompts(tokenizer, train, cfg.data)) <= 200
    assert len(build_sources(cfg.data, cfg.ppo.seed, 1, tokenizer=tokenizer)[1]) == 1  # validation is capped
    strict = tiny_config(*overrides, "data.on_bad_row=error")
    with pytest.raises(DataError, match=rf"{data_file}:2: .*prompt_too_long"):
        build_sources(strict.data, strict.ppo.seed, strict.ppo.validation.max_samples, tokenizer=tokenizer)
