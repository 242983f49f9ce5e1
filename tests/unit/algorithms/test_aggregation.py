"""Loss aggregation (``loss.aggregation``, ``value.loss_aggregation``): each mode's weights against hand-computed
ones, the minibatch's loss the same for any microbatching under every mode, and a per-microbatch normalisation
(the bug verl#6957 and NeMo-RL#2839 fixed) caught by the same check."""

import pytest
import torch

from dtppo.algorithms.aggregation import loss_token_weights
from dtppo.algorithms.losses import policy_loss, value_loss
from dtppo.config import OptimizerConfig, SchedulerConfig
from dtppo.ops import masked_mean, weighted_sum
from dtppo.workers.updater import Updater
from tests.support.batches import synthetic_experience, unequal_rows_mask

MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]

# Three sequences with 1, 3 and 0 trained tokens (the third is masked out: not a sequence that counts).
MASK = torch.tensor([[0, 1, 0, 0], [0, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.float32)


@pytest.mark.parametrize(
    "mode, row0, row1",
    [
        ("token-mean", 1 / 4, 1 / 4),  # N = 4 tokens
        ("token-sum", 1.0, 1.0),
        ("seq-mean-token-sum", 1 / 2, 1 / 2),  # S = 2 sequences
        ("seq-mean-token-mean", 1 / 2, 1 / 6),  # 1 / (S · n_b): n = 1 and 3
        ("seq-mean-token-sum-norm", 1 / 20, 1 / 20),  # 1 / (S · H), H = 10
    ],
)
def test_weights_match_the_hand_computed_ones(mode, row0, row1):
    weights = loss_token_weights(MASK, mode, horizon=10)
    expected = torch.tensor([[0, row0, 0, 0], [0, row1, row1, row1], [0, 0, 0, 0]], dtype=torch.float64)
    torch.testing.assert_close(weights.double(), expected, rtol=0, atol=1e-7)


def test_a_losses_value_is_its_mode_applied_to_the_per_token_losses():
    # A constant per-token loss c: token-mean gives c, seq-mean-token-sum the mean sequence sum (c·(1+3)/2), ...
    values, returns = torch.zeros(3, 4), torch.full((3, 4), 2.0)  # 0.5·(V − R)² = 2 per token
    returns[2] = float("nan")  # poison on a row that does not train
    expected = {"token-mean": 2.0, "token-sum": 8.0, "seq-mean-token-sum": 4.0, "seq-mean-token-mean": 2.0}
    for mode, value in expected.items():
        weights = loss_token_weights(MASK, mode, horizon=10)
        loss, _ = value_loss(values, values, returns, MASK, clip=None, weights=weights)
        assert float(loss) == pytest.approx(value, rel=1e-6), mode
    lp = torch.zeros(3, 4)
    adv = torch.where(MASK.bool(), torch.tensor(-1.0), torch.tensor(float("nan")))  # per-token loss 1, NaN off mask
    weights = loss_token_weights(MASK, "seq-mean-token-sum-norm", horizon=10)
    loss, _ = policy_loss(lp, lp, adv, MASK, 0.2, 0.2, gen_logprobs=lp, weights=weights)
    assert float(loss) == pytest.approx(4 / 20, rel=1e-6)  # 4 tokens of loss 1, over S·H = 20


def test_a_weighted_loss_without_weights_is_the_plain_sum():
    lp = torch.randn(3, 4)
    adv = torch.randn(3, 4)
    plain, _ = policy_loss(lp, lp.detach(), adv, MASK, 0.2, 0.2, gen_logprobs=lp)
    weighted, _ = policy_loss(lp, lp.detach(), adv, MASK, 0.2, 0.2, gen_logprobs=lp, weights=MASK)
    assert float(plain) == float(weighted)


def _experience(batch=8, width=6):
    # 1 to 5 valid tokens, out of order: rows of unequal lengths
    return synthetic_experience(batch=batch, width=width, response_mask=unequal_rows_mask(batch, width, stride=3))


def _trained(mode, micro, loss_of):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    engine = Updater(
        model, OptimizerConfig(lr=1e-2), SchedulerConfig(), max_grad_norm=100.0, aggregation=mode, horizon=9
    )
    metrics = engine.train(_experience(), loss_of(model), global_batch=8, micro_batch=micro)
    return metrics, torch.cat([p.detach().flatten() for p in model.parameters()])


def _aggregated(model):
    def fn(micro):
        err = (model(micro.input_ids.unsqueeze(-1)).squeeze(-1) - micro.returns) ** 2
        return weighted_sum(err, micro.loss_weights), {}

    return fn


def _per_microbatch_mean(model):
    """The bug: each microbatch's own token mean, whatever the minibatch holds."""

    def fn(micro):
        err = (model(micro.input_ids.unsqueeze(-1)).squeeze(-1) - micro.returns) ** 2
        return masked_mean(err, micro.response_mask), {}

    return fn


@pytest.mark.parametrize("mode", MODES)
def test_one_microbatch_of_8_equals_8_of_1_under_every_mode(mode):
    whole, whole_params = _trained(mode, 8, _aggregated)
    for micro in (1, 2):
        split, split_params = _trained(mode, micro, _aggregated)
        assert abs(split["loss"] - whole["loss"]) < 1e-6 * max(1.0, abs(float(whole["loss"])))
        assert float((split_params - whole_params).abs().max()) < 1e-6
    # the modes are different losses (AdamW's first step ignores a constant scale: the per-sequence mean differs
    # from the token mean in direction, the other modes in the loss's scale)
    token_mean, token_mean_params = _trained("token-mean", 8, _aggregated)
    if mode == "seq-mean-token-mean":
        assert float((token_mean_params - whole_params).abs().max()) > 1e-5
    elif mode != "token-mean":
        assert abs(float(token_mean["loss"]) - float(whole["loss"])) > 1e-3


def test_a_per_microbatch_mean_fails_the_same_check():
    whole = _trained("token-mean", 8, _per_microbatch_mean)[1]
    split = _trained("token-mean", 1, _per_microbatch_mean)[1]
    assert float((split - whole).abs().max()) > 1e-4


def test_modes_differ_only_in_their_weights():
    # seq-mean-token-mean on rows of equal length equals token-mean (n_b = N / S for every row)
    mask = torch.ones(4, 5)
    torch.testing.assert_close(
        loss_token_weights(mask, "seq-mean-token-mean", 1), loss_token_weights(mask, "token-mean", 1)
    )
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        loss_token_weights(mask, "token-median", 1)
