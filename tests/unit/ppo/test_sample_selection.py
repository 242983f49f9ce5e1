"""Dynamic sampling's criteria, DAPO's overlong penalty and the critic's warmup gate, against hand-computed cases."""

import math

import pytest
import torch

from dtppo import config as config_lib
from dtppo.algorithms.filtering import first_response_token, groups_with_reward_spread, groups_with_value_error
from dtppo.algorithms.shaping import overlong_penalty
from dtppo.errors import RunStopped
from dtppo.ppo.critic_warmup import CriticWarmup
from dtppo.ppo.dynamic_sampling import GroupFilter, build_group_filter
from dtppo.ppo.rollouts import Rollout
from dtppo.rewards.rewarder import RewardBreakdown, concat_breakdowns
from dtppo.types import Experience


def test_overlong_penalty_is_zero_before_the_buffer_and_falls_linearly_to_minus_factor():
    # max 48 new tokens, a buffer of 16: free up to 32 tokens, −0.5·factor at 40, −factor at 48
    lengths = torch.tensor([10, 32, 33, 40, 48])
    expected = torch.tensor([0.0, 0.0, -1 / 16, -0.5, -1.0])
    torch.testing.assert_close(overlong_penalty(lengths, 48, 16, 1.0), expected)
    torch.testing.assert_close(overlong_penalty(lengths, 48, 16, 0.5), expected * 0.5)
    assert float(overlong_penalty(torch.tensor([48]), 48, 48, 1.0)) == -1.0  # the whole response is the buffer


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


def _batch(rewards, values0):
    """Rows [prompt | 2 response tokens]; V(s_0) at the first response token, a wrong value after it."""
    n = len(rewards)
    mask = torch.tensor([[0.0, 1.0, 1.0]] * n)
    values = torch.tensor([[float("nan"), v, -9.0] for v in values0])
    return Experience(
        input_ids=torch.zeros(n, 3, dtype=torch.long),
        attention_mask=torch.ones(n, 3, dtype=torch.long),
        response_mask=mask,
        gen_logprobs=torch.zeros(n, 3),
        truncated=torch.zeros(n, dtype=torch.bool),
        rewards=torch.tensor(rewards),
        old_values=values,
    )


def test_group_filter_applies_the_configured_criterion_to_a_batch():
    batch = _batch([1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.45, 0.45])
    spread = GroupFilter("reward_std", 2, 0.1, 1.0, 1, 1)
    assert spread.keep(batch).tolist() == [False, True]
    assert spread.rows(torch.tensor([False, True])) == [2, 3]
    value = GroupFilter("value_error", 1, 0.1, 1.0, 1, 1)
    assert value.keep(batch).tolist() == [False, False, True, True]
    # γ < 1 discounts the return to the first token: 1.0·0.5 at the first of two tokens
    assert GroupFilter("value_error", 1, 0.1, 0.5, 1, 1).keep(batch).tolist() == [True, True, True, False]


def test_build_group_filter_is_none_unless_enabled():
    cfg = config_lib.from_dict({})
    assert build_group_filter(cfg) is None
    cfg = config_lib.from_dict(
        {
            "ppo": {
                "num_prompts_per_step": 8,
                "num_generations_per_prompt": 4,
                "dynamic_sampling": {"enabled": True, "max_gen_batches": 3},
            }
        }
    )
    assert build_group_filter(cfg) == GroupFilter("reward_std", 4, 0.1, 1.0, 8, 3)


def _scored(rewards: list[float], tag: int) -> tuple[Rollout, RewardBreakdown]:
    """A scored batch of groups of 2 whose problems are named (tag, row) and whose reward parts are the rewards."""
    batch = _batch(rewards, [0.0] * len(rewards))
    scores = RewardBreakdown(torch.tensor(rewards), {"acc": list(rewards)}, torch.zeros(len(rewards), dtype=bool), {})
    return Rollout([(tag, i) for i in range(len(rewards))], batch, 0, {}), scores


def test_the_refill_loop_keeps_the_first_passing_groups_batch_after_batch():
    # 2 groups needed; batch 0 has one with spread (rows 2, 3), batch 1 has two (rows 0-1, 2-3): its second is surplus
    batches = [_scored([1.0, 1.0, 0.0, 1.0], 0), _scored([0.0, 1.0, 1.0, 0.0], 1), _scored([0.0, 1.0] * 2, 2)]
    asked = []

    def more(extra):
        asked.append(extra)
        return batches[extra]

    kept = GroupFilter("reward_std", 2, 0.1, 1.0, 2, 5).fill(*batches[0], more, pad_id=0)
    assert asked == [1]  # no third batch once enough groups passed
    assert kept.rollout.problems == [(0, 2), (0, 3), (1, 0), (1, 1)]
    assert kept.rollout.experience.rewards.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert kept.reward_means == {"acc": 0.5}
    assert kept.selection == {
        "train/dynamic_sampling/gen_batches": 2.0,
        "train/dynamic_sampling/kept_groups": 3.0,  # passed the criterion, the surplus included
        "train/dynamic_sampling/filtered_groups": 1.0,
    }


def test_the_refill_loop_stops_the_run_past_max_gen_batches():
    flat = _scored([1.0, 1.0, 0.0, 0.0], 0)
    with pytest.raises(RunStopped, match="only 0 of the 2 prompt groups .* in 3 generated batches"):
        GroupFilter("reward_std", 2, 0.1, 1.0, 2, 3).fill(*flat, lambda extra: flat, pad_id=0)


def test_reward_breakdowns_concatenate_and_select_rows():
    failed = torch.tensor([False, False, True])
    a = RewardBreakdown(torch.tensor([1.0, 0.0]), {"acc": [1.0, 0.0], "fmt": [None, 1.0]}, failed[:2], _counts(1, 0))
    b = RewardBreakdown(torch.tensor([0.0]), {"acc": [None], "fmt": [None]}, failed[2:], _counts(0, 1))
    both = concat_breakdowns([a, b])
    assert both.total.tolist() == [1.0, 0.0, 0.0] and both.failed.tolist() == failed.tolist()
    kept = both.take([1, 2])
    assert kept.failed.tolist() == [False, True]
    # a failed sample is in no part's mean; the counts stay the whole batch's
    assert kept.means() == {"acc": 0.0, "fmt": 1.0} | _counts(1, 1)


def _counts(timed_out: int, crashed: int) -> dict[str, int]:
    return {
        "crashed_chunks": crashed,
        "timed_out_chunks": timed_out,
        "raised_chunks": 0,
        "out_of_memory_chunks": 0,
        "failed_samples": timed_out + crashed,
    }


def _warmup(**value):
    return CriticWarmup(config_lib.from_dict({"value": value}))


def test_fixed_warmup_counts_its_critic_only_steps():
    warmup = CriticWarmup(config_lib.from_dict({"ppo": {"policy_training_start_step": 2}}))
    assert [warmup.policy_trains(step, None) for step in range(4)] == [False, False, True, True]
    assert [warmup.metrics(s)["train/critic/warmup_steps"] for s in range(4)] == [1, 2, 2, 2]


def test_ev_gate_opens_on_the_window_mean_skipping_undefined_steps():
    warmup = _warmup(warmup_until_ev=0.5, warmup_ev_window=2, warmup_max_steps=10)
    evs = [-0.4, 0.3, None, 0.6, 0.5, 0.1]  # window means: −, −0.05, (skipped), 0.45, 0.55 -> opens at step 4
    trains = [warmup.policy_trains(step, ev) for step, ev in enumerate(evs)]
    assert trains == [False, False, False, False, True, True]
    assert warmup.metrics(5) == {"train/critic/warmup_steps": 4.0, "train/critic/warmup_window_ev": 0.55}
    assert math.isclose(warmup.window_ev(), 0.55)


def test_ev_gate_is_capped_and_resumes_from_its_state():
    warmup = _warmup(warmup_until_ev=0.9, warmup_ev_window=3, warmup_max_steps=3)
    assert [warmup.policy_trains(step, 0.2) for step in range(5)] == [False, False, False, True, True]
    assert warmup.metrics(4)["train/critic/warmup_steps"] == 3.0
    # a resume mid-warmup continues the window: the state holds the EVs seen so far
    first = _warmup(warmup_until_ev=0.5, warmup_ev_window=2)
    first.policy_trains(0, 0.4)
    resumed = _warmup(warmup_until_ev=0.5, warmup_ev_window=2)
    resumed.load_state_dict(first.state_dict())
    assert resumed.policy_trains(1, 0.7) and not _warmup(warmup_until_ev=0.5, warmup_ev_window=2).policy_trains(1, 0.7)


@pytest.mark.parametrize(
    "tree, key",
    [
        ({"ppo": {"dynamic_sampling": {"enabled": True}}}, "ppo.dynamic_sampling.criterion"),  # one sample per prompt
        ({"ppo": {"dynamic_sampling": {"enabled": True, "criterion": "value_error"}}}, None),  # judges single samples
        (
            {"value": {"warmup_until_ev": 0.3}, "ppo": {"policy_training_start_step": 5}},
            "ppo.policy_training_start_step",
        ),
        ({"ppo": {"overlong_shaping": {"buffer": 64}}}, "ppo.overlong_shaping.buffer"),  # max_new_tokens is 48
        (
            {"ppo": {"advantage_estimator": "grpo", "num_generations_per_prompt": 2}, "value": {"warm_start": "x"}},
            "value.warm_start",
        ),
    ],
)
def test_settings_that_cannot_work_are_refused_naming_the_key(tree, key):
    if key is None:
        config_lib.from_dict(tree)
        return
    with pytest.raises(config_lib.ConfigError, match=key.replace(".", r"\.")):
        config_lib.from_dict(tree)
