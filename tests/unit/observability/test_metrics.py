"""Step metrics from microbatch statistics (``dtppo.observability.metrics``): each name's suffix says how it reduces
(``_sum`` added, ``_min``/``_max`` kept extreme), epochs averaged with their extremes kept, sums turned into token
means, and the one host sync that turns an empty microbatch's ±inf extreme into -1. Across ranks:
tests/distributed/test_aggregation_ranks.py."""

import math

import torch

from dtppo.observability.metrics import mean_over, normalise, reduce_across_ranks, reduce_stats, to_floats


def _stats(loss_sum, ratio_min, ratio_max):
    return {
        "loss_sum": torch.tensor(loss_sum),
        "ratio_min": torch.tensor(ratio_min),
        "ratio_max": torch.tensor(ratio_max),
    }


def test_microbatch_statistics_reduce_by_the_suffix_of_their_name():
    out = reduce_stats([_stats(1.5, 0.9, 1.1), _stats(2.0, 0.7, 1.05), _stats(0.5, math.inf, -math.inf)])
    assert out == {"loss_sum": 4.0, "ratio_min": torch.tensor(0.7), "ratio_max": torch.tensor(1.1)}


def test_reducing_does_not_write_into_the_first_microbatchs_tensors():
    first = _stats(1.0, 1.0, 1.0)
    reduce_stats([first, _stats(2.0, 0.5, 3.0)])
    assert first == _stats(1.0, 1.0, 1.0)


def test_epochs_are_averaged_and_their_extremes_kept():
    out = mean_over([_stats(3.0, 0.8, 1.2), _stats(1.0, 0.9, 1.5)])
    assert out == {"loss_sum": 2.0, "ratio_min": torch.tensor(0.8), "ratio_max": torch.tensor(1.5)}


def test_normalise_turns_sums_into_token_means_and_a_zero_count_into_the_sum():
    stats = _stats(6.0, 0.5, 2.0)
    assert normalise(stats, torch.tensor(4.0)) == {"loss": 1.5, "ratio_min": 0.5, "ratio_max": 2.0}
    assert normalise(stats, torch.tensor(0.0))["loss"] == 6.0  # clamped to one token: no division by zero


def test_to_floats_is_every_metric_as_a_float_with_infinite_extremes_as_minus_one():
    out = to_floats({"a_min": torch.tensor(math.inf), "b_max": torch.tensor(-math.inf), "c": torch.tensor(math.inf)})
    assert out == {"a_min": -1.0, "b_max": -1.0, "c": math.inf}  # only extremes: an infinite mean stays visible
    out = to_floats({"x": torch.tensor(0.1, dtype=torch.float64), "y": 2, "z": torch.tensor([3.0])})
    assert out == {"x": 0.1, "y": 2.0, "z": 3.0} and all(type(v) is float for v in out.values())


def test_in_one_process_the_reduction_across_ranks_changes_nothing():
    stats = _stats(1.0, 0.5, 2.0)
    assert reduce_across_ranks(stats) == stats
