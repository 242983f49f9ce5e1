"""Made-up batches for tests and benchmarks (``dtppo.testing.batches``): token rows laid out as a sampled batch
(prompt, response, padding with id 0), every tensor a function of the arguments, the first half's responses
shortened, and rows of unequal trained-token counts."""

import pytest
import torch

from dtppo.testing.batches import synthetic_experience, unequal_rows_mask


def test_token_rows_are_prompt_then_response_right_padded_with_zero_ids():
    e = synthetic_experience(
        50, batch=4, prompt_lengths=[2, 3, 1, 4], response_lengths=[5, 1, 2, 3], short_first_half=None
    )
    assert e.input_ids.shape == (4, 7) and e.attention_mask.sum(-1).tolist() == [7, 4, 3, 7]
    assert e.response_mask.sum(-1).tolist() == [5, 1, 2, 3] and e.response_mask[1].tolist() == [0, 0, 0, 1, 0, 0, 0]
    attended = e.attention_mask.bool()
    assert (e.input_ids[~attended] == 0).all() and (e.input_ids[attended] >= 3).all() and (e.input_ids < 50).all()
    assert (e.advantages[e.response_mask == 0] == 0).all() and (e.returns[e.response_mask == 0] == 0).all()
    assert ((e.rewards >= 0) & (e.rewards < 1)).all()


def test_the_same_arguments_give_the_same_batch_and_another_seed_another():
    a, b, c = synthetic_experience(50, seed=3), synthetic_experience(50, seed=3), synthetic_experience(50, seed=4)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.returns, b.returns)
    assert not torch.equal(a.input_ids, c.input_ids) or not torch.equal(a.rewards, c.rewards)


def test_the_first_half_holds_the_short_responses_and_optional_fields_can_be_left_out():
    e = synthetic_experience(50, batch=8, response_lengths=range(10, 14), short_first_half=range(1, 4))
    lengths = e.response_mask.sum(-1)
    assert (lengths[:4] <= 3).all() and (lengths[4:] >= 10).all()
    bare = synthetic_experience(50, rewards=False, targets=False)
    assert bare.rewards is None and bare.advantages is None and bare.returns is None
    with pytest.raises(ValueError, match="2 lengths for a batch of 8"):
        synthetic_experience(50, prompt_lengths=[1, 2])


def test_feature_rows_attend_everywhere_and_train_the_given_mask():
    mask = unequal_rows_mask(4, 6)
    e = synthetic_experience(batch=4, width=6, response_mask=mask)
    assert e.input_ids.dtype == torch.float32 and e.attention_mask.all() and e.response_mask is mask
    assert synthetic_experience(batch=4, width=6).response_mask.all()


def test_unequal_rows_train_one_more_position_each_up_to_the_width():
    assert unequal_rows_mask(4, 4).tolist() == [[0, 1, 0, 0], [0, 1, 1, 0], [0, 1, 1, 1], [0, 1, 0, 0]]
    assert unequal_rows_mask(3, 6, stride=2).sum(-1).tolist() == [1, 3, 5]
