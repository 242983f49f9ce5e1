"""Sharded (FSDP2 dp=2, HSDP, critic TP=2 ± SP, policy TP=2 + SP) and unsharded paths agree on the same global batch
(fp32, gloo): forward outputs, the losses' statistics, every parameter's gradient and the update, each judged as
tests/support/parity.py says."""

import pytest

from tests.support.harness import run, worker_round
from tests.support.parity import LAYOUTS, MICRO, assert_same_update, max_abs_diff_dict


@pytest.fixture(scope="module")
def reference():
    return run(worker_round, 1, MICRO)


def _layout(name: str) -> dict:
    world, extra, _ = LAYOUTS[name]
    return run(worker_round, world, MICRO + extra)


def test_update_really_changes_weights(reference):
    fresh = run(worker_round, 1, MICRO + ["policy.optimizer.lr=1e-12", "value.optimizer.lr=1e-12"])
    assert max_abs_diff_dict(reference["policy_weights"], fresh["policy_weights"]) > 1e-4
    assert max_abs_diff_dict(reference["value_weights"], fresh["value_weights"]) > 1e-4


def test_the_checks_fail_on_one_wrong_gradient_entry_or_a_wrong_update(reference):
    """Negative controls of the comparison itself: one gradient entry off by 0.1 % of its tensor's largest entry
    (a sharding error that keeps the norm and the signs), or one tensor's update 1 % off, is caught."""
    grads = {k: v.clone() for k, v in reference["policy_grads"].items()}
    name = next(iter(grads))
    grads[name].view(-1)[0] += 1e-3 * float(grads[name].abs().max())
    with pytest.raises(AssertionError):
        assert_same_update(reference, {**reference, "policy_grads": grads}, check_value=False)
    weights = dict(reference["value_weights"])
    name = "score.weight"
    weights[name] = weights[name] + 0.01 * (weights[name] - reference["value_initial"][name])
    with pytest.raises(AssertionError):
        assert_same_update(reference, {**reference, "value_weights": weights}, check_policy=False)
    assert_same_update(reference, reference)  # the unchanged run passes


def test_fsdp_dp2_matches_single_process(reference):
    assert_same_update(reference, _layout("fsdp dp2"))


def test_fsdp_dp2_per_microbatch_resharding_and_padded_rows_match_single_process(reference):
    # The non-default paths: FSDP's own per-microbatch all-gather / reduce-scatter, and no sequence packing.
    assert_same_update(reference, _layout("fsdp dp2 per-microbatch, padded"))


def test_hsdp_two_replicas_match_single_process_and_hold_the_whole_model(reference):
    sharded = _layout("fsdp dp2")
    replicated = _layout("hsdp 2 replicas")
    assert_same_update(reference, replicated)
    assert replicated["policy_local_numel"] == reference["policy_local_numel"]  # each rank: a whole replica
    assert sharded["policy_local_numel"] < 0.6 * reference["policy_local_numel"]  # FSDP: about half each


def test_critic_tp2_matches_single_process(reference):
    assert_same_update(reference, _layout("critic tp2"), check_policy=False)


def test_critic_dp2_x_tp2_matches_single_process(reference):
    """FSDP2 over tp's Shard(0) places ``_StridedShard``: the gradient norm once counted those shards as copies
    (2.856 for 3.031 here) and clipped too little."""
    assert_same_update(reference, _layout("critic dp2 x tp2"), check_policy=False)


def test_critic_tp2_sequence_parallel_matches_single_process(reference):
    assert_same_update(reference, _layout("critic tp2 sp"), check_policy=False)


def test_policy_tp2_sequence_parallel_matches_single_process(reference):
    """The chunked LM head (models/logprobs.py) reads the hidden state the TP(+SP) blocks hand back whole."""
    assert_same_update(reference, _layout("policy tp2 sp"), check_value=False)


def test_microbatch_1_x_8_matches_8_x_1(reference):
    assert_same_update(reference, _layout("micro 1"))
    assert_same_update(reference, _layout("micro 8"))
