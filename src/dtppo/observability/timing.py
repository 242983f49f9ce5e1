"""Wall time per named phase of a step (``timing/<phase>``)."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch


class PhaseTimer:
    """Wall time per named phase, reported as ``timing/<phase>`` seconds. On CUDA each phase ends by waiting for the
    device: its kernels run after the host has moved on, and a phase that ends without a host sync (a weight refit:
    copies and gathers) would under-report and hand its time to the next phase."""

    def __init__(self, device: torch.device) -> None:
        self.seconds: dict[str, float] = {}
        self.synchronize = torch.cuda.synchronize if device.type == "cuda" else None

    @contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        yield
        if self.synchronize is not None:
            self.synchronize()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start
