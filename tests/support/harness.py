"""Run the same worker code in one process and on 2 gloo ranks, and return what each computed
(``dtppo.testing.workers``, which the benchmarks use too), and the updater the layout tests build."""

from __future__ import annotations

import torch

from dtppo.config import OptimizerConfig, SchedulerConfig
from dtppo.testing.configs import make_config
from dtppo.testing.workers import capture_first_gradients, full_state_dict, run, worker_results, worker_round
from dtppo.workers.updater import Updater

__all__ = [
    "capture_first_gradients",
    "full_state_dict",
    "layout_updater",
    "make_config",
    "run",
    "worker_results",
    "worker_round",
]


def layout_updater(model: torch.nn.Module, layout, max_grad_norm: float = 1.0, **options) -> Updater:
    """An Updater (AdamW lr 1e-2) over ``model``, already wrapped for ``layout``'s ranks; ``options``: the
    updater's keyword arguments (``unsharded_accumulation``, ``aggregation``, ...)."""
    return layout.updater(model, OptimizerConfig(lr=1e-2, eps=1e-6), SchedulerConfig(), max_grad_norm, **options)
