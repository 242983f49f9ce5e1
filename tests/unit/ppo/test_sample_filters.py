"""The samples of a step that train and how much each token counts (``dtppo.ppo.sample_filters``): DAPO's overlong
penalty and filtering, the mismatch mask and the truncated importance weights, against float64 references written
out here, with poison (huge and NaN log-probs) on every position off the response, which must change nothing; each
filter keeps the samples a failed reward already left out; a step left with nothing stops the run in one line."""

import math

import pytest
import torch

from dtppo import config as config_lib
from dtppo.errors import RunStopped
from dtppo.ppo.sample_filters import drop_mismatched, drop_truncated, filter_samples, overlong_penalties
from dtppo.types import Experience

# Rows [prompt | response | pad] of width 7: (prompt length, response length), the last two truncated.
ROWS = [(2, 3), (1, 5), (3, 2), (2, 4)]
GEN = [[-0.5, -1.0, -1.2], [-0.1, -0.3, -2.0, -0.4, -0.6], [-1.5, -0.05], [-0.7, -0.7, -0.9, -0.2]]
OLD = [[-0.5, -1.1, -0.5], [-0.1, -0.3, -2.0, -0.4, -0.6], [-0.5, -0.05], [-0.2, -1.0, -0.9, -0.8]]


def _experience(poison: float = 1.0e6, sample_mask=None) -> Experience:
    """The rows above with ``poison`` in both log-prob tensors wherever the response mask is 0."""
    batch, width = len(ROWS), 7
    mask, gen, old = torch.zeros(batch, width), torch.full((batch, width), poison), torch.full((batch, width), poison)
    for b, (prompt, response) in enumerate(ROWS):
        mask[b, prompt : prompt + response] = 1.0
        gen[b, prompt : prompt + response] = torch.tensor(GEN[b])
        old[b, prompt : prompt + response] = torch.tensor(OLD[b])
    return Experience(
        input_ids=torch.ones(batch, width, dtype=torch.long),
        attention_mask=torch.ones(batch, width, dtype=torch.long),
        response_mask=mask,
        gen_logprobs=gen,
        truncated=torch.tensor([False, False, True, True]),
        rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]),
        old_logprobs=old,
        sample_mask=sample_mask,
    )


def _errors() -> list[float]:
    """float64: each row's mean over its response tokens of exp(|log π_gen − log π_old|)."""
    return [sum(math.exp(abs(g - o)) for g, o in zip(gs, os)) / len(gs) for gs, os in zip(GEN, OLD)]


def _cfg(**tree) -> config_lib.Config:
    return config_lib.from_dict(tree)


def test_overlong_penalties_follow_each_responses_length_and_are_zero_when_off():
    e = _experience()
    assert torch.equal(overlong_penalties(e, _cfg()), torch.zeros(4))
    cfg = _cfg(policy={"generation": {"max_new_tokens": 6}}, ppo={"overlong_shaping": {"buffer": 4, "factor": 0.5}})
    # free up to 6 - 4 = 2 tokens, then -0.5/4 per token: lengths 3, 5, 2, 4
    want = [min(-(n - 2) / 4 * 0.5, 0.0) for _, n in ROWS]
    torch.testing.assert_close(overlong_penalties(e, cfg), torch.tensor(want))
    assert torch.equal(overlong_penalties(_experience(poison=float("nan")), cfg), overlong_penalties(e, cfg))


def test_with_no_filter_configured_the_rows_pass_unchanged():
    e = _experience()
    assert filter_samples(e, _cfg()) is e


def test_overlong_filtering_leaves_out_truncated_samples_and_keeps_the_failed_ones_out():
    out = filter_samples(_experience(), _cfg(ppo={"overlong_filtering": True}))
    assert out.sample_mask.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert out.train_mask[2:].abs().sum() == 0 and torch.equal(out.train_mask[:2], out.response_mask[:2])
    scored = drop_truncated(_experience(sample_mask=torch.tensor([0.0, 1.0, 1.0, 1.0])))
    assert scored.sample_mask.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_when_every_scored_sample_was_truncated_the_run_stops_naming_the_key():
    e = _experience(sample_mask=torch.tensor([0.0, 0.0, 1.0, 1.0]))
    with pytest.raises(RunStopped, match=r"every scored sample of the step was truncated .*ppo\.overlong_filtering"):
        drop_truncated(e)


@pytest.mark.parametrize("poison", [1.0e6, float("nan"), -float("inf")])
def test_the_mismatch_mask_keeps_samples_within_the_threshold_by_the_float64_error(poison):
    errors = _errors()
    threshold = sorted(errors)[2]  # between the second and third largest: two samples stay
    threshold += 1e-6
    out = drop_mismatched(_experience(poison), threshold)
    assert out.sample_mask.tolist() == [float(err <= threshold) for err in errors]
    assert out.sample_mask.sum() == 3
    # a failed reward stays out whatever its error
    failed_first = drop_mismatched(_experience(poison, sample_mask=torch.tensor([0.0, 1.0, 1.0, 1.0])), threshold)
    assert failed_first.sample_mask.tolist() == [0.0] + [float(err <= threshold) for err in errors[1:]]


def test_the_mismatch_filter_reads_its_threshold_from_the_config():
    cfg = _cfg(loss={"rollout_correction": {"seq_logprob_error_threshold": 1.05}})
    out = filter_samples(_experience(), cfg)
    assert out.sample_mask.tolist() == [float(err <= 1.05) for err in _errors()]


def test_when_every_sample_mismatches_the_run_stops_naming_the_key_and_the_smallest_error():
    smallest = min(_errors())
    assert smallest == 1.0  # row 1: the generator's log-probs are the trainer's
    e = _experience().replace(gen_logprobs=_experience().gen_logprobs - 0.5 * _experience().response_mask)
    with pytest.raises(RunStopped, match=r"seq_logprob_error_threshold = 1\.1 \(smallest 1\.649\)"):
        drop_mismatched(e, 1.1)


def _weights_reference(level: str, cap: float, keep: list[float]) -> torch.Tensor:
    """float64 truncated importance weights min(π_old/π_gen, cap), per token or per sequence, 0 off the samples
    that train."""
    out = torch.zeros(len(ROWS), 7, dtype=torch.float64)
    for b, (prompt, response) in enumerate(ROWS):
        ratios = [math.exp(o - g) for g, o in zip(GEN[b], OLD[b])]
        if level == "sequence":
            ratios = [math.prod(ratios)] * response
        out[b, prompt : prompt + response] = torch.tensor([min(r, cap) for r in ratios], dtype=torch.float64) * keep[b]
    return out


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("poison", [1.0e6, float("nan")])
def test_importance_weights_are_the_capped_ratios_on_the_tokens_that_train(level, poison):
    cfg = _cfg(
        ppo={"overlong_filtering": True},
        loss={"rollout_correction": {"importance_sampling": level, "importance_sampling_cap": 1.5}},
    )
    out = filter_samples(_experience(poison), cfg)
    want = _weights_reference(level, 1.5, keep=[1.0, 1.0, 0.0, 0.0])
    torch.testing.assert_close(out.is_weights.double(), want, rtol=1e-6, atol=1e-7)
    assert (out.is_weights <= 1.5 + 1e-6).all()
    # row 0's last token (π_old/π_gen = e^0.7), and its sequence (e^0.6), are where the cap binds
    assert out.is_weights[0, 4].item() == pytest.approx(1.5)
    assert out.is_weights[0, 2].item() == pytest.approx(1.5 if level == "sequence" else 1.0)


def test_an_overlong_buffer_longer_than_a_response_is_refused_naming_the_key():
    with pytest.raises(config_lib.ConfigError, match=r"ppo\.overlong_shaping\.buffer"):
        _cfg(ppo={"overlong_shaping": {"buffer": 64}})  # max_new_tokens is 48
