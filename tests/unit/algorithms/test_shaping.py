"""DAPO's soft overlong penalty (``dtppo.algorithms.shaping``) against hand-computed lengths, and its float64
formula. Where a run applies it: tests/unit/ppo/test_sample_filters.py."""

import torch

from dtppo.algorithms.shaping import overlong_penalty


def test_overlong_penalty_is_zero_before_the_buffer_and_falls_linearly_to_minus_factor():
    # max 48 new tokens, a buffer of 16: free up to 32 tokens, −0.5·factor at 40, −factor at 48
    lengths = torch.tensor([10, 32, 33, 40, 48])
    expected = torch.tensor([0.0, 0.0, -1 / 16, -0.5, -1.0])
    torch.testing.assert_close(overlong_penalty(lengths, 48, 16, 1.0), expected)
    torch.testing.assert_close(overlong_penalty(lengths, 48, 16, 0.5), expected * 0.5)
    assert float(overlong_penalty(torch.tensor([48]), 48, 48, 1.0)) == -1.0  # the whole response is the buffer


def test_overlong_penalty_is_the_float64_formula_at_every_length():
    lengths = torch.arange(0, 101)
    got = overlong_penalty(lengths, 100, 30, 0.7)
    want = [min(-(n - 70) / 30 * 0.7, 0.0) for n in range(101)]
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-7)
    assert (got <= 0).all() and got[:71].abs().sum() == 0
