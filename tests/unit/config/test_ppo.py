"""The PPO loop's sections (``dtppo.config.ppo``): GAE, validation, DAPO refuse a bad value naming its key."""

from __future__ import annotations

import pytest

from tests.support.bad_configs import assert_refused, ids

BAD = [
    ("range", ["ppo.gae.lambda_policy=1.5"], "ppo.gae.lambda_policy"),
    ("bad choice", ["ppo.advantage_estimator=ppo"], "ppo.advantage_estimator"),
    ("async", ["ppo.max_lag=-1"], "ppo.max_lag"),
]


@pytest.mark.parametrize("kind, overrides, key", BAD, ids=ids(BAD))
def test_a_bad_value_is_refused_naming_its_key(kind, overrides, key):
    assert_refused(kind, overrides, key)
