"""Token-budget microbatches (``policy.max_tokens_per_microbatch``, ``value.max_tokens_per_microbatch``): the
first-fit-decreasing grouping by hand, the split that keeps data-parallel ranks in step, the gradient equal to fixed
microbatches' under every ``loss.aggregation`` on rows of very uneven lengths, and a per-microbatch mean (the
normalisation bug) that the same check catches."""

import pytest
import torch

from dtppo import config as config_lib
from dtppo.config import ConfigError, OptimizerConfig, SchedulerConfig
from dtppo.ops import masked_mean, weighted_sum
from dtppo.workers.updater import Updater, split_to, token_budget_microbatches
from tests.support.batches import synthetic_experience

MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]

# Real tokens per row: one row of 16 among rows of 1 to 5 (a long response among short ones).
LENGTHS = [2, 16, 1, 5, 3, 1, 4, 2]


def _groups(lengths, budget):
    return [rows.tolist() for rows in token_budget_microbatches(torch.tensor(lengths), budget)]


def test_rows_go_longest_first_into_the_first_microbatch_they_fit():
    # sorted 10 (row 1), 4 (3), 4 (4), 3 (0), 2 (5), 1 (2): 10 is over the budget and goes alone
    assert _groups([3, 10, 1, 4, 4, 2], 8) == [[1], [3, 4], [0, 5, 2]]
    assert _groups([3, 10, 1, 4, 4, 2], 100) == [[1, 3, 4, 0, 5, 2]]
    assert _groups([2, 2, 2], 1) == [[0], [1], [2]]


def test_splitting_halves_the_heaviest_group_until_the_count_is_reached():
    groups = token_budget_microbatches(torch.tensor([3, 10, 1, 4, 4, 2]), 8)
    lengths = torch.tensor([3, 10, 1, 4, 4, 2])
    # [3, 4] holds 8 tokens, [0, 5, 2] 6: the first is cut, then the second
    assert [g.tolist() for g in split_to(groups, lengths, 5)] == [[1], [3], [4], [0, 5], [2]]
    assert [g.tolist() for g in split_to(groups, lengths, 3)] == [[1], [3, 4], [0, 5, 2]]


def _experience():
    width = max(LENGTHS)
    experience = synthetic_experience(batch=len(LENGTHS), width=width)
    attention = (torch.arange(width) < torch.tensor(LENGTHS).unsqueeze(-1)).float()
    trained = attention.clone()
    trained[:, 0] = 0  # the first token is the prompt's
    trained[2] = attention[2]  # a one-token row that trains its token
    return experience.replace(attention_mask=attention, response_mask=trained)


def _trained(mode, loss_of, micro_batch=8, max_tokens=None):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    engine = Updater(
        model, OptimizerConfig(lr=1e-2), SchedulerConfig(), max_grad_norm=100.0, aggregation=mode, horizon=17
    )
    seen = []
    metrics = engine.train(_experience(), loss_of(model, seen), 8, micro_batch, max_tokens)
    return metrics, torch.cat([p.detach().flatten() for p in model.parameters()]), seen


def _aggregated(model, seen):
    def fn(micro):
        seen.append(int(micro.attention_mask.sum()))
        err = (model(micro.input_ids.unsqueeze(-1)).squeeze(-1) - micro.returns) ** 2
        return weighted_sum(err, micro.loss_weights), {}

    return fn


def _per_microbatch_mean(model, seen):
    """The bug: each microbatch's own token mean, whatever the minibatch holds."""

    def fn(micro):
        seen.append(int(micro.attention_mask.sum()))
        err = (model(micro.input_ids.unsqueeze(-1)).squeeze(-1) - micro.returns) ** 2
        return masked_mean(err, micro.response_mask), {}

    return fn


@pytest.mark.parametrize("mode", MODES)
def test_token_budget_microbatches_give_the_fixed_microbatches_gradient_under_every_mode(mode):
    whole, whole_params, _ = _trained(mode, _aggregated)
    for budget, tokens in [(1, [16, 5, 4, 3, 2, 2, 1, 1]), (8, [16, 8, 8, 2]), (18, [18, 16])]:
        split, split_params, seen = _trained(mode, _aggregated, max_tokens=budget)
        assert sorted(seen, reverse=True) == tokens  # the grouping happened, and each microbatch is its rows
        assert abs(split["loss"] - whole["loss"]) < 1e-6 * max(1.0, abs(float(whole["loss"])))
        assert float((split_params - whole_params).abs().max()) < 1e-6
    # the budget replaces the row count: micro_batch is unused, the whole minibatch is one microbatch
    _, params, seen = _trained(mode, _aggregated, micro_batch=1, max_tokens=100)
    assert seen == [sum(LENGTHS)] and float((params - whole_params).abs().max()) < 1e-6


def test_a_per_microbatch_mean_fails_the_same_check():
    whole = _trained("token-mean", _per_microbatch_mean)[1]
    split = _trained("token-mean", _per_microbatch_mean, max_tokens=8)[1]
    assert float((split - whole).abs().max()) > 1e-4


@pytest.mark.parametrize("section", ["policy", "value"])
@pytest.mark.parametrize("bad", [0, -5])
def test_the_budget_is_a_positive_int_or_null(section, bad):
    assert getattr(config_lib.from_dict({}), section).max_tokens_per_microbatch is None
    built = config_lib.from_dict({section: {"max_tokens_per_microbatch": 64}})
    assert getattr(built, section).max_tokens_per_microbatch == 64
    with pytest.raises(ConfigError, match=rf"^{section}\.max_tokens_per_microbatch: must be >= 1 or null"):
        config_lib.from_dict({section: {"max_tokens_per_microbatch": bad}})
