"""PhaseTimer waits for the device at the end of every phase on CUDA (its kernels run after the host moves on) and
never on CPU: a CUDA stand-in counts the waits and where they fall."""

import time

import torch

from dtppo.observability.timing import PhaseTimer


def test_each_phase_ends_with_a_device_sync_on_cuda_and_its_wait_is_counted(monkeypatch):
    events = []

    def synchronize():  # the device finishing the phase's queued kernels
        time.sleep(0.05)
        events.append("sync")

    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    timer = PhaseTimer(torch.device("cuda", 0))
    for phase in ("weight_refit", "generation", "weight_refit"):
        with timer(phase):
            events.append(phase)
    assert events == ["weight_refit", "sync", "generation", "sync", "weight_refit", "sync"]
    # the device's time lands in the phase that queued it, not the next one
    assert timer.seconds["weight_refit"] >= 0.1 and timer.seconds["generation"] >= 0.05


def test_no_sync_on_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: (_ for _ in ()).throw(AssertionError("synced on CPU")))
    timer = PhaseTimer(torch.device("cpu"))
    with timer("generation"):
        pass
    assert set(timer.seconds) == {"generation"}
