"""The critic's section (``dtppo.config.value``), its warmup and V-trace, refuse a bad value naming its key."""

from __future__ import annotations

import pytest

from tests.support.bad_configs import assert_refused, ids

BAD = [
    ("range", ["value.head_init_std=-1"], "value.head_init_std"),
    ("batch layout", ["value.train_micro_batch_size=0"], "value.train_micro_batch_size"),
    ("vtrace", ["value.target_correction=retrace"], "value.target_correction"),
    ("vtrace", ["value.vtrace.rho_cap=0"], "value.vtrace.rho_cap"),
    ("vtrace", ["value.vtrace.c_cap=.inf"], "value.vtrace.c_cap"),
]


@pytest.mark.parametrize("kind, overrides, key", BAD, ids=ids(BAD))
def test_a_bad_value_is_refused_naming_its_key(kind, overrides, key):
    assert_refused(kind, overrides, key)
