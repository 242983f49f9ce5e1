"""The optimizer and schedule sections (``dtppo.config.optim``) refuse a bad value naming its key."""

from __future__ import annotations

import pytest

from tests.support.bad_configs import assert_refused, ids

BAD = [
    ("learning rate", ["policy.optimizer.lr=-1e-4"], "policy.optimizer.lr"),
    ("learning rate", ["value.optimizer.lr=0"], "value.optimizer.lr"),
    ("learning rate", ["sft.optimizer.lr=.inf"], "sft.optimizer.lr"),
    ("optimizer", ["policy.optimizer.eps=0"], "policy.optimizer.eps"),
    ("optimizer", ["value.optimizer.weight_decay=-0.1"], "value.optimizer.weight_decay"),
    ("schedule", ["policy.scheduler.warmup_steps=-5"], "policy.scheduler.warmup_steps"),
    ("schedule", ["sft.scheduler.min_lr_ratio=2"], "sft.scheduler.min_lr_ratio"),
]


@pytest.mark.parametrize("kind, overrides, key", BAD, ids=ids(BAD))
def test_a_bad_value_is_refused_naming_its_key(kind, overrides, key):
    assert_refused(kind, overrides, key)
