"""``policy.generation.decode_graph`` stays below dynamo's recompile limit and keeps few decoders alive: the
distinct (batch, cache length) shapes a run's rollouts and validations compile, counted from a recipe's own prompts
without compiling anything (a recorder stands in for the decoder)."""

import logging

import pytest
import torch

from dtppo.data.chat import encode_prompts
from dtppo.data.loader import PromptLoader, build_sources
from dtppo.generation import generator as generator_module
from dtppo.generation.generator import (
    GRAPH_DECODERS_KEPT,
    MAX_GRAPH_SHAPES,
    TorchGenerator,
    graph_cache_length,
)
from dtppo.models.causal_lm import build_causal_lm
from dtppo.models.tokenizer import build_char_tokenizer
from tests.support.recipes import REPO, tiny_config

GSM8K = [
    f"data.{split}.path={REPO / 'tests/data/gsm8k' / name}"
    for split, name in [("train", "train.jsonl"), ("validation", "test.jsonl")]
]


class Recorder:
    """Stands in for StaticKVDecoder: records what the generator builds and refreshes."""

    built: list[tuple[int, int, bool]] = []

    def __init__(self, model, batch: int, max_len: int, compile: bool = False):
        self.shape, self.refreshed = (batch, max_len), 0
        Recorder.built.append((batch, max_len, compile))

    def refresh(self) -> None:
        self.refreshed += 1


@pytest.fixture
def recorded(monkeypatch):
    monkeypatch.setattr(generator_module, "StaticKVDecoder", Recorder)
    monkeypatch.setattr(generator_module, "_compiled_shapes", set())
    Recorder.built = []
    return Recorder.built


def _generator(cfg) -> TorchGenerator:
    tok = build_char_tokenizer()
    model = build_causal_lm(None, cfg.policy.model.tiny, len(tok), tok.pad_token_id, tok.eos_token_id, 0)
    cache_len = cfg.generation_prompt_tokens + cfg.policy.generation.max_new_tokens
    return TorchGenerator(model, (tok.eos_token_id,), tok.pad_token_id, compile=True, cache_len=cache_len)


def _run_schedule(cfg, steps: int) -> TorchGenerator:
    """The decoders a run asks for: each step's rollout (its prompts' width + new tokens), a validation every
    ``ppo.validation.period`` steps in batches of ``ppo.validation.batch_size`` (the last one partial)."""
    tok, generator = build_char_tokenizer(), _generator(cfg)
    source, validation = build_sources(cfg.data, cfg.ppo.seed, cfg.ppo.validation.max_samples, tokenizer=tok)
    loader, new = PromptLoader(source, 0), cfg.policy.generation.max_new_tokens
    for step in range(steps):
        prompts = encode_prompts(tok, loader.next_batch(cfg.ppo.num_prompts_per_step), cfg.data)
        generator._decoder(cfg.samples_per_step, max(map(len, prompts)) + new)
        if step % cfg.ppo.validation.period == 0:
            for start in range(0, len(validation), cfg.ppo.validation.batch_size):
                batch = encode_prompts(tok, validation[start : start + cfg.ppo.validation.batch_size], cfg.data)
                generator._decoder(len(batch), max(map(len, batch)) + new)
    return generator


@pytest.mark.parametrize(
    "overrides",
    [
        (
            "ppo.validation.max_samples=100",
            "ppo.validation.batch_size=32",
            "ppo.validation.period=2",
        ),  # 3 full validation batches + 4
        (
            "data.task=gsm8k",
            *GSM8K,
            "ppo.validation.max_samples=50",
            "ppo.validation.batch_size=16",
            "data.max_prompt_tokens=512",
        ),
    ],
    ids=["tiny_math", "gsm8k"],
)
def test_a_runs_prompts_compile_one_shape_per_batch_size_and_keep_two_decoders(recorded, overrides):
    cfg = tiny_config("policy.generation.decode_graph=true", "ppo.init_from_sft=false", *overrides)
    generator = _run_schedule(cfg, steps=12)
    compiled = {(b, n) for b, n, compile in recorded if compile}
    batches = {b for b, _ in compiled}
    # Prompt widths vary every step; the cache length does not: one shape per batch size (the rollout's, the
    # validation's, its partial last batch's), far below the recompile limit.
    assert {n for _, n in compiled} == {graph_cache_length(1, generator.cache_len)}
    assert len(compiled) == len(batches) == 3 <= MAX_GRAPH_SHAPES
    assert all(compile for *_, compile in recorded)
    assert len(generator.graph_decoders) == GRAPH_DECODERS_KEPT


def test_shapes_past_the_cap_decode_eagerly_with_one_warning(recorded, caplog):
    """Episodes whose active rows shrink turn by turn, and widths beyond the generator's cache length: bounded."""
    generator = _generator(tiny_config("policy.generation.decode_graph=true"))
    with caplog.at_level(logging.WARNING, logger="dtppo.generation.generator"):
        for batch in range(16, 0, -1):
            generator._decoder(batch, 40)
        generator._decoder(16, 40)  # compiled earlier, evicted since: rebuilt, not a new shape
    compiled = [(b, n) for b, n, compile in recorded if compile]
    assert len(set(compiled)) == MAX_GRAPH_SHAPES and compiled[-1] == (16, compiled[0][1])
    assert [b for b, _, compile in recorded if not compile] == list(range(16 - MAX_GRAPH_SHAPES, 0, -1))
    assert [r.levelname for r in caplog.records] == ["WARNING"] and "decode eagerly" in caplog.records[0].message
    assert list(generator.graph_decoders) == [(11, compiled[0][1]), (16, compiled[0][1])]


def test_cache_lengths_beyond_the_generators_share_power_of_two_buckets():
    assert graph_cache_length(10, 300) == graph_cache_length(300, 300) == 320  # one length while it fits
    assert [graph_cache_length(n, 300) for n in (301, 512, 513, 1000, 1025)] == [512, 512, 1024, 1024, 2048]
    assert [graph_cache_length(n, None) for n in (1, 64, 65, 129)] == [64, 64, 128, 256]
    assert torch._dynamo.config.recompile_limit > MAX_GRAPH_SHAPES  # capped below dynamo's limit
