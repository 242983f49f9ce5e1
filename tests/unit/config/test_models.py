"""The models' sections (``dtppo.config.models``): tiny shapes, adapters and layouts refuse a bad value naming its
key."""

from __future__ import annotations

import pytest

from tests.support.bad_configs import assert_refused, ids

BAD = [
    ("parallel layout", ["policy.parallel.sequence_parallel=true"], "policy.parallel.sequence_parallel"),
    ("parallel layout", ["value.parallel.dp_replicate=0"], "value.parallel.dp_replicate"),
    ("parallel layout", ["value.parallel.cp=0"], "value.parallel.cp"),
    ("parallel layout", ["policy.parallel.cp_layout=ring"], "policy.parallel.cp_layout"),
    ("model shape", ["policy.model.tiny.hidden_size=100"], "policy.model.tiny.hidden_size"),
    ("model shape", ["value.model.tiny.num_kv_heads=3"], "value.model.tiny.num_kv_heads"),
    ("model shape", ["policy.model.tiny.num_layers=0"], "policy.model.tiny.num_layers"),
]


@pytest.mark.parametrize("kind, overrides, key", BAD, ids=ids(BAD))
def test_a_bad_value_is_refused_naming_its_key(kind, overrides, key):
    assert_refused(kind, overrides, key)
