"""Dynamic sampling's criteria (``dtppo.algorithms.filtering``) against hand-computed groups: the reward spread of a
group, the critic's miss on it, and the first response token of each row. Applied to a step's batch:
tests/unit/ppo/test_dynamic_sampling.py."""

import torch

from dtppo.algorithms.filtering import first_response_token, groups_with_reward_spread, groups_with_value_error


def test_reward_spread_keeps_mixed_groups_only():
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.2, 0.2, 0.2, 0.2000001])
    assert groups_with_reward_spread(rewards, 4).tolist() == [False, True, True]
    assert groups_with_reward_spread(rewards, 2).tolist() == [False, False, True, False, False, True]
    assert groups_with_reward_spread(rewards, 1).tolist() == [False] * 12  # one sample has no spread


def test_value_error_keeps_groups_the_critic_missed():
    returns = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    values = torch.tensor([0.95, 0.95, 0.5, 0.5, 0.5, 0.5])
    # group 0 all solved and predicted (error 0.05); group 1 all failed, predicted 0.5; group 2 mixed
    assert groups_with_value_error(returns, values, 2, 0.1).tolist() == [False, True, True]
    # with one sample per prompt the criterion still judges each prompt (reward spread cannot)
    assert groups_with_value_error(returns, values, 1, 0.1).tolist() == [False, False, True, True, True, True]
    assert groups_with_value_error(returns, values, 2, 0.6).tolist() == [False, False, False]


def test_first_response_token_reads_each_rows_first_masked_position():
    x = torch.arange(12.0).reshape(3, 4)
    mask = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 0], [1, 1, 1, 1]])
    assert first_response_token(x, mask).tolist() == [2.0, 5.0, 8.0]


def test_a_groups_verdict_depends_on_its_own_rows_only():
    torch.manual_seed(0)
    rewards, values = torch.rand(12), torch.rand(12)
    spread, error = groups_with_reward_spread(rewards, 3), groups_with_value_error(rewards, values, 3, 0.2)
    for g in range(4):
        rows = slice(3 * g, 3 * g + 3)
        assert groups_with_reward_spread(rewards[rows], 3).item() == spread[g].item()
        assert groups_with_value_error(rewards[rows], values[rows], 3, 0.2).item() == error[g].item()
