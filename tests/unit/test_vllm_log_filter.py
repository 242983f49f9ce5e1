"""The vllm backend drops one harmless warning that vLLM logs at every in-place refit, and nothing else."""

import logging

from dtppo.rollout.vllm_engine import RotaryReloadFilter


def record(*args) -> logging.LogRecord:
    return logging.LogRecord("vllm", logging.WARNING, "layerwise.py", 266, "%s: Failed to load weights", args, None)


def test_only_the_rotary_cache_warning_is_dropped():
    keep = RotaryReloadFilter().filter
    assert not keep(record("RotaryEmbedding"))
    assert keep(record("QKVParallelLinear"))  # a real weight that failed to load still shows
    assert keep(logging.LogRecord("vllm", logging.WARNING, "x.py", 1, "something else", (), None))
