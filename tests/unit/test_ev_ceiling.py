"""bench/ev_ceiling.py's predictors: leave-one-out group means and position buckets, by hand."""

import importlib.util
from pathlib import Path

import torch

_BENCH = Path(__file__).resolve().parents[2] / "bench"
_SPEC = importlib.util.spec_from_file_location("ev_ceiling", _BENCH / "ev_ceiling.py")
ev_ceiling = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(ev_ceiling)


def test_group_mean_leave_one_out_by_hand():
    values = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1, 2])
    means, has = ev_ceiling.group_mean(values, groups, leave_one_out=False)
    assert torch.allclose(means, torch.tensor([1 / 3, 1 / 3, 1 / 3, 1.0, 1.0], dtype=torch.float64))
    loo, has = ev_ceiling.group_mean(values, groups, leave_one_out=True)
    assert torch.allclose(loo, torch.tensor([0.0, 0.5, 0.5, 0.0, 0.0], dtype=torch.float64))
    assert has.tolist() == [True, True, True, False, False]  # a sample alone in its group has no other samples


def test_form_oracle_is_perfect_when_the_form_decides_the_reward():
    rewards = torch.tensor([0.0, 0.0, 1.0, 1.0])
    bare = torch.tensor([True, True, False, False])
    preds = ev_ceiling.predictors(rewards, torch.tensor([0, 0, 1, 1]), bare)
    assert torch.equal(preds["form oracle"], torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=torch.float64))
    # leave-one-out within a prompt: each sample sees its twin, which has the same reward here
    assert torch.equal(preds["prompt MC mean (leave-one-out)"], rewards.double())


def test_position_buckets_split_the_response_tokens():
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0, 0]], dtype=torch.float32)
    buckets = ev_ceiling.position_masks(mask)
    assert torch.equal(sum(buckets.values()), mask)
    assert buckets["positions 0-0"].tolist() == [[0, 1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0]]
    assert buckets["positions 1-3"].tolist() == [[0, 0, 1, 1, 1, 0, 0], [0, 1, 0, 0, 0, 0, 0]]
