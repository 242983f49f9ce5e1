"""bench/learning/ev_ceiling.py's predictors: leave-one-out group means and position buckets, by hand."""

import torch

from bench.learning import ev_ceiling


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
    preds = ev_ceiling.predictors(rewards, torch.tensor([0, 0, 1, 1]), bare, hard=None)
    assert "difficulty oracle" not in preds
    assert torch.equal(preds["form oracle"], torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=torch.float64))
    # leave-one-out within a prompt: each sample sees its twin, which has the same reward here
    assert torch.equal(preds["prompt MC mean (leave-one-out)"], rewards.double())


def test_difficulty_oracle_is_each_difficultys_mean_return():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    bare = torch.tensor([False, True, False, False, True, False])
    hard = torch.tensor([False, False, False, True, True, True])
    preds = ev_ceiling.predictors(rewards, torch.tensor([0, 0, 1, 2, 2, 3]), bare, hard)
    assert torch.allclose(preds["difficulty oracle"], torch.tensor([2 / 3] * 3 + [0.0] * 3, dtype=torch.float64))
    assert torch.equal(preds["difficulty x form"], torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0], dtype=torch.float64))


def test_a_hard_question_shows_a_number_above_the_easy_range():
    assert ev_ceiling.is_hard("Tom has 347 eggs. He wins 5 more. How many eggs does Tom have now?", 5)
    assert not ev_ceiling.is_hard("Tom has 3 eggs. He wins 5 more. How many eggs does Tom have now?", 5)


def test_position_buckets_split_the_response_tokens():
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0, 0]], dtype=torch.float32)
    buckets = ev_ceiling.position_masks(mask)
    assert torch.equal(sum(buckets.values()), mask)
    assert buckets["positions 0-0"].tolist() == [[0, 1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0]]
    assert buckets["positions 1-3"].tolist() == [[0, 0, 1, 1, 1, 0, 0], [0, 1, 0, 0, 0, 0, 0]]
