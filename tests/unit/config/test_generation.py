"""``policy.generation`` (``dtppo.config.generation``) refuses a bad value naming its key."""

from __future__ import annotations

import pytest

from tests.support.bad_configs import assert_refused, ids

BAD = [
    ("bad choice", ["policy.generation.backend=jax"], "policy.generation.backend"),
    ("range", ["policy.generation.top_p=0"], "policy.generation.top_p"),
    ("range", ["policy.generation.min_new_tokens=-1"], "policy.generation.min_new_tokens"),
    ("range", ["policy.generation.min_new_tokens=100000"], "policy.generation.min_new_tokens"),
    ("bad choice", ["policy.generation.decoder=vllm"], "policy.generation.decoder"),
    (
        "decoder",
        ["policy.generation.decoder=hf", "policy.generation.decode_graph=true"],
        "policy.generation.decode_graph",
    ),
]


@pytest.mark.parametrize("kind, overrides, key", BAD, ids=ids(BAD))
def test_a_bad_value_is_refused_naming_its_key(kind, overrides, key):
    assert_refused(kind, overrides, key)
