"""The input sections (``dtppo.config.inputs``): data, SFT and the environment refuse a bad value naming its key
(the reward's: test_reward.py)."""

from __future__ import annotations

import pytest

from tests.support.bad_configs import assert_refused, ids

BAD = [
    ("bad choice", ["data.on_bad_row=ignore"], "data.on_bad_row"),
    ("learning rate", ["sft.careless_stage.lr=0"], "sft.careless_stage.lr"),
    ("range", ["data.max_prompt_tokens=0"], "data.max_prompt_tokens"),
    ("range", ["data.tiny_math.min_ops=3"], "data.tiny_math.min_ops"),
    ("range", ["data.tiny_math.hard_fraction=1.5"], "data.tiny_math.hard_fraction"),
    ("range", ["data.tiny_math.kind=running_sum", "data.tiny_math.hard_fraction=0.5"], "data.tiny_math.hard_fraction"),
    (
        "range",
        ["data.tiny_math.hard_fraction=0.5", "data.tiny_math.hard_max_number=20"],
        "data.tiny_math.hard_max_number",
    ),
    ("schedule", ["sft.log_period=0"], "sft.log_period"),
    ("schedule", ["sft.num_steps=-1"], "sft.num_steps"),
    ("missing file", ["data.task=gsm8k"], "data.train.path"),
]


@pytest.mark.parametrize("kind, overrides, key", BAD, ids=ids(BAD))
def test_a_bad_value_is_refused_naming_its_key(kind, overrides, key):
    assert_refused(kind, overrides, key)
