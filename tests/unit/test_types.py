"""The typed batches (``dtppo.types``): the one response-mask builder and the episode rows built by hand, an episode's
return, the row selections (slice, take, shard, a data-parallel rank's balanced share) that trim to the longest
row, rows of different widths concatenated with their padding, and a request answered in parts."""

import pytest
import torch

from dtppo.types import (
    ROLLOUT_FIELDS,
    Experience,
    SampleRequest,
    SamplingParams,
    Segment,
    balanced_rows,
    block_rows,
    build_episode_rows,
    build_response_mask,
    concat_rows,
)
from tests.support.episodes import hand_episode

EOS = 1


def test_the_response_mask_is_one_from_the_prompts_end_for_the_responses_length():
    mask = build_response_mask(torch.tensor([2, 0, 3]), torch.tensor([3, 2, 0]), 6)
    assert mask.dtype == torch.float32
    assert mask.tolist() == [[0, 0, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0], [0] * 6]


def test_episode_rows_masks_turns_and_rewards_by_hand():
    e = hand_episode()
    assert e.input_ids.tolist() == [[5, 6, 7, 8, 9, 9, 9, 10, 11, 12], [5, 13, 14, 0, 0, 0, 0, 0, 0, 0]]
    assert e.attention_mask.tolist() == [[1] * 10, [1, 1, 1] + [0] * 7]
    assert e.response_mask.tolist() == [[0, 0, 1, 1, 0, 0, 0, 1, 1, 1], [0, 1, 1] + [0] * 7]
    assert e.turn_ids.tolist() == [[0, 0, 1, 1, 1, 1, 1, 2, 2, 2], [0, 1, 1] + [0] * 7]
    assert e.step_rewards.tolist() == [[0, 0, 0, 0.5, 0, 0, 0, 0, 0, -1.0], [0.0] * 10]
    assert torch.allclose(e.gen_logprobs[0, 7:], torch.tensor([-0.3] * 3))
    assert e.gen_logprobs[0, 4:7].abs().sum() == 0
    assert e.truncated.tolist() == [False, True]
    assert e.episode_end.tolist() == [0, 3]


def test_one_turn_episode_rows_are_the_single_turn_rows():
    prompts, responses = [[4, 5, 6], [7]], [[8, 9], [10, 11, 12, EOS]]
    e = build_episode_rows(prompts, [[Segment(r, 1, [0.0] * len(r))] for r in responses], [0, 0], pad_id=0)
    expected = build_response_mask(torch.tensor([3, 1]), torch.tensor([2, 4]), 5)
    assert torch.equal(e.response_mask, expected)
    assert e.step_rewards.abs().sum() == 0


def test_an_episodes_return_is_its_final_reward_plus_every_turns():
    e = hand_episode().replace(rewards=torch.tensor([1.0, -0.5]))
    assert e.total_rewards.tolist() == [1.0 + 0.5 - 1.0, -0.5]  # row 0: turn rewards 0.5 and -1


def _rows(lengths: list[int], width: int = 6) -> Experience:
    """Right-padded rows of ``lengths`` attended tokens: ids 10·row + position, a response on the last two tokens,
    returns equal to the ids and poison (1e6) on every padding position of the float fields."""
    batch = len(lengths)
    attended = torch.arange(width)[None] < torch.tensor(lengths)[:, None]
    ids = torch.arange(batch)[:, None] * 10 + torch.arange(width)[None]
    response = attended & (torch.arange(width)[None] >= torch.tensor(lengths)[:, None] - 2)
    poison = torch.full((batch, width), 1e6)
    return Experience(
        input_ids=torch.where(attended, ids, 0),
        attention_mask=attended.long(),
        response_mask=response.float(),
        gen_logprobs=torch.where(attended, -0.5, poison),
        truncated=torch.tensor([i % 2 == 1 for i in range(batch)]),
        rewards=torch.arange(batch, dtype=torch.float32),
        returns=torch.where(attended, ids.float(), poison),
    )


def test_train_mask_is_the_response_mask_of_the_samples_that_train():
    e = _rows([4, 6, 3])
    assert e.train_mask is e.response_mask
    kept = e.replace(sample_mask=torch.tensor([1.0, 0.0, 1.0]))
    assert torch.equal(kept.train_mask[1], torch.zeros(6)) and torch.equal(kept.train_mask[0], e.response_mask[0])
    assert e.total_rewards is e.rewards  # single-turn: the reward alone


def test_slice_take_and_shard_trim_to_the_longest_row_they_keep():
    e = _rows([2, 5, 3, 4])
    part = e.slice(2, 4)
    assert part.batch_size == 2 and part.input_ids.shape[1] == 4
    assert torch.equal(part.returns, e.returns[2:4, :4]) and torch.equal(part.rewards, torch.tensor([2.0, 3.0]))
    picked = e.take(torch.tensor([0, 2]))
    assert picked.input_ids.shape == (2, 3) and picked.truncated.tolist() == [False, False]
    assert torch.equal(e.take(torch.tensor([3, 1])).rewards, torch.tensor([3.0, 1.0]))
    assert e.slice(1, 1).input_ids.shape == (0, 0)
    assert block_rows(8, 1, 4) == slice(2, 4)
    shard = e.shard(1, 2)
    assert torch.equal(shard.input_ids, e.input_ids[2:4, :4]) and shard.old_values is None


def test_experience_take_picks_rows_and_trims():
    widths = torch.tensor([[2], [5], [3], [6], [1], [4], [2], [3]])
    exp = _rows([6] * 8).replace(attention_mask=(torch.arange(6)[None] < widths).long())
    part = exp.take(torch.tensor([0, 2, 4]))
    assert part.batch_size == 3 and part.input_ids.shape[1] == 3
    assert torch.equal(part.returns, exp.returns[[0, 2, 4], :3])


def test_balanced_rows_gives_equal_shares_with_even_tokens():
    lengths = torch.tensor([200, 10, 180, 30, 150, 40, 120, 60])
    shares = [balanced_rows(lengths, r, 2) for r in range(2)]
    assert [len(s) for s in shares] == [4, 4]
    assert sorted(torch.cat(shares).tolist()) == list(range(8))
    tokens = [int(lengths[s].sum()) for s in shares]
    assert tokens == [390, 400]  # contiguous blocks would give 420 vs 370
    assert torch.equal(balanced_rows(lengths, 0, 1), torch.arange(8))


def test_concat_rows_pads_tokens_with_the_pad_id_and_everything_else_with_zero():
    narrow, wide = _rows([3], width=3), _rows([5, 4], width=5)
    both = concat_rows([narrow, wide], pad_id=7)
    assert both.input_ids.shape == (3, 5) and both.input_ids[0].tolist() == [0, 1, 2, 7, 7]
    assert both.attention_mask[0].tolist() == [1, 1, 1, 0, 0] and both.returns[0, 3:].tolist() == [0.0, 0.0]
    assert both.rewards.tolist() == [0.0, 0.0, 1.0] and both.truncated.tolist() == [False, False, True]
    assert both.old_values is None  # only the fields the first block has
    assert "input_ids" in ROLLOUT_FIELDS and "rewards" not in ROLLOUT_FIELDS


def test_a_request_taken_in_parts_keeps_each_prompts_sample_id_and_row():
    request = SampleRequest(
        [[1], [2, 2], [3]], SamplingParams(4), 9, torch.tensor([10, 11, 12]), [{"i": 0}, {"i": 1}, {"i": 2}]
    )
    part = request.take([2, 0])
    assert part.prompts == [[3], [1]] and part.sample_ids.tolist() == [12, 10] and part.rows == [{"i": 2}, {"i": 0}]
    assert len(request.take(slice(1, 3))) == 2 and request.take(slice(1, 3)).sample_ids.tolist() == [11, 12]
    assert SampleRequest([[1]], SamplingParams(4), 9, torch.tensor([0])).take([0]).rows is None


def test_a_segment_is_an_action_when_it_carries_log_probs():
    assert Segment([1, 2], 1, [-0.1, -0.2]).is_action and not Segment([3], 1).is_action
    with pytest.raises(Exception):
        Segment([1], 1).turn = 2  # frozen
