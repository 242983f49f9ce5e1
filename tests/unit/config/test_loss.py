"""The losses' sections (``dtppo.config.loss``): clipping, KL, rollout correction refuse a bad value naming its key."""

from __future__ import annotations

import pytest

from tests.support.bad_configs import assert_refused, ids

BAD = [
    ("clip range", ["loss.ratio_clip_low=1.0"], "loss.ratio_clip_low"),
    ("clip range", ["loss.ratio_clip_high=-0.2"], "loss.ratio_clip_high"),
    ("clip range", ["loss.ratio_clip_c=1.0"], "loss.ratio_clip_c"),
    ("clip range", ["loss.value_clip=0"], "loss.value_clip"),
    (
        "mismatch correction",
        ["loss.rollout_correction.importance_sampling_cap=0.5"],
        "loss.rollout_correction.importance_sampling_cap",
    ),
    (
        "mismatch correction",
        ["loss.rollout_correction.importance_sampling=tokens"],
        "loss.rollout_correction.importance_sampling",
    ),
    (
        "mismatch correction",
        ["loss.rollout_correction.seq_logprob_error_threshold=0.9"],
        "loss.rollout_correction.seq_logprob_error_threshold",
    ),
    ("range", ["loss.kl.coef=-0.1"], "loss.kl.coef"),
]


@pytest.mark.parametrize("kind, overrides, key", BAD, ids=ids(BAD))
def test_a_bad_value_is_refused_naming_its_key(kind, overrides, key):
    assert_refused(kind, overrides, key)
