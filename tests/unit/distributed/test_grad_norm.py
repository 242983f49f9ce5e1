"""Gradient-norm clipping (``dtppo.distributed.grad_norm``) in one process, against a float64 norm written out here
and torch's own clipping: the norm before clipping is returned, gradients past the bound are scaled to it and those
within it are left alone, parameters without a gradient are skipped. Sharded gradients (FSDP, TP) on ranks:
tests/distributed/test_grad_norm.py."""

import math

import pytest
import torch

from dtppo.distributed.grad_norm import clip_grad_norm_, global_grad_norm


def _parameters(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.zeros(shape)) for shape in [(3, 4), (5,), (2, 2, 2)]]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 3
    return params


def _norm64(grads) -> float:
    return math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))


def test_the_global_norm_is_the_norm_of_every_gradient_together():
    grads = [p.grad for p in _parameters()]
    assert global_grad_norm(grads).item() == pytest.approx(_norm64(grads), rel=1e-6)


def test_clipping_scales_every_gradient_to_the_bound_and_returns_the_norm_before():
    params, reference = _parameters(), _parameters()
    before = _norm64([p.grad for p in params])
    assert before > 1.0
    total = clip_grad_norm_(params, 1.0)
    assert total.item() == pytest.approx(before, rel=1e-6)
    assert _norm64([p.grad for p in params]) == pytest.approx(1.0, rel=1e-5)
    torch.nn.utils.clip_grad_norm_(reference, 1.0)
    for mine, torchs in zip(params, reference):
        torch.testing.assert_close(mine.grad, torchs.grad)


def test_gradients_within_the_bound_are_left_alone_and_missing_ones_skipped():
    params = _parameters()
    params.append(torch.nn.Parameter(torch.ones(2)))  # no gradient
    grads = [p.grad.clone() for p in params[:3]]
    total = clip_grad_norm_(params, 1e6)
    assert total.item() == pytest.approx(_norm64(grads), rel=1e-6)
    assert all(torch.equal(p.grad, g) for p, g in zip(params, grads)) and params[3].grad is None
    assert clip_grad_norm_([torch.nn.Parameter(torch.ones(2))], 1.0).item() == 0.0
