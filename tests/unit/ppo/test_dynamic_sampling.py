"""Dynamic sampling (``dtppo.ppo.dynamic_sampling``): the configured criterion applied to a step's batch, the refill
loop that keeps the first passing groups batch after batch and stops the run past ``max_gen_batches``, and the
settings that cannot work. The criteria themselves: tests/unit/algorithms/test_filtering.py."""

import pytest
import torch

from dtppo import config as config_lib
from dtppo.errors import RunStopped
from dtppo.ppo.dynamic_sampling import GroupFilter, build_group_filter
from dtppo.ppo.rollouts import Rollout
from dtppo.rewards.rewarder import RewardBreakdown
from dtppo.types import Experience


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
    n = len(rewards)
    scores = RewardBreakdown(torch.tensor(rewards), [()] * n, {"acc": list(rewards)}, torch.zeros(n, dtype=bool), {})
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


@pytest.mark.parametrize(
    "tree, key",
    [
        ({"ppo": {"dynamic_sampling": {"enabled": True}}}, "ppo.dynamic_sampling.criterion"),  # one sample per prompt
        ({"ppo": {"dynamic_sampling": {"enabled": True, "criterion": "value_error"}}}, None),  # judges single samples
    ],
)
def test_settings_that_cannot_work_are_refused_naming_the_key(tree, key):
    if key is None:
        config_lib.from_dict(tree)
        return
    with pytest.raises(config_lib.ConfigError, match=key.replace(".", r"\.")):
        config_lib.from_dict(tree)
