"""The actor's section (``dtppo.config.policy``): its subsections' defaults and its own rules, each refused naming
the field."""

from __future__ import annotations

import pytest

from dtppo.config import ConfigError, PolicyConfig
from tests.support.bad_configs import assert_refused, ids


def test_defaults():
    policy = PolicyConfig()
    assert (policy.optimizer.lr, policy.generation.max_new_tokens, policy.lora.enabled) == (1e-4, 48, False)
    assert (policy.train_global_batch_size, policy.max_tokens_per_microbatch, policy.sequence_packing) == (
        32,
        None,
        True,
    )


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("train_global_batch_size", 0, "must be >= 1, got 0"),
        ("logprob_chunk_size", 0, "must be >= 1, got 0"),
        ("max_tokens_per_microbatch", 0, "must be >= 1 or null, got 0"),
        ("max_grad_norm", 0.0, "must be > 0"),
    ],
)
def test_a_field_out_of_range_is_refused_naming_it(field, value, problem):
    with pytest.raises(ConfigError, match=rf"^{field}: {problem}"):
        PolicyConfig(**{field: value})


BAD = [
    ("range", ["policy.logprob_batch_size=0"], "policy.logprob_batch_size"),
    ("range", ["policy.max_grad_norm=-1"], "policy.max_grad_norm"),
    ("wrong type", ["policy.sequence_packing=3"], "policy.sequence_packing"),
]


@pytest.mark.parametrize("kind, overrides, key", BAD, ids=ids(BAD))
def test_a_bad_override_is_refused_with_its_full_key(kind, overrides, key):
    assert_refused(kind, overrides, key)
