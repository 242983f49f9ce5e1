"""The vllm backend drops two harmless warnings that vLLM logs at every refit and engine start, and nothing else."""

import logging

from dtppo.generation.vllm_engine import HarmlessVLLMWarnings


def record(msg: str, *args) -> logging.LogRecord:
    return logging.LogRecord("vllm", logging.WARNING, "x.py", 1, msg, args, None)


def test_only_the_rotary_cache_and_chat_warmup_warnings_are_dropped():
    keep = HarmlessVLLMWarnings().filter
    assert not keep(record("%s: Failed to load weights", "RotaryEmbedding"))
    assert keep(record("%s: Failed to load weights", "QKVParallelLinear"))  # a real weight that failed still shows
    assert not keep(record("Chat template warmup failed"))
    assert keep(record("Multi-modal warmup failed"))
    assert keep(record("something else"))
