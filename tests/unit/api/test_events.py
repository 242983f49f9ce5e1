"""A run's events for its caller (``dtppo.api.events``): callbacks called with keywords, in order, in the caller's
process; from another process over the authenticated loopback connection; a callback's exception raised, not lost."""

import multiprocessing
from pathlib import Path

import pytest

from dtppo.api.events import Callbacks, EventListener, RemoteEvents


class Recorder:
    def __init__(self):
        self.calls = []

    def on_train_begin(self, config):
        self.calls.append(("begin", config))

    def on_step_end(self, step, metrics, **kwargs):
        self.calls.append(("step", step, metrics))

    def on_validation_end(self, step, metrics):
        self.calls.append(("validation", step, metrics))

    def on_save(self, step, path):
        self.calls.append(("save", step, path))

    def on_train_end(self, results):
        self.calls.append(("end", results))


class OnlySteps:
    def __init__(self):
        self.steps = []

    def on_step_end(self, step, metrics):
        self.steps.append(step)


def test_each_callback_gets_the_hooks_it_has_and_the_history_every_step():
    recorder, only = Recorder(), OnlySteps()
    callbacks = Callbacks([recorder, only])
    callbacks.train_begin("cfg")
    callbacks.validation_end(0, {"validation/accuracy": 0.25})
    callbacks.step_end(1, {"train/reward": 0.5})
    callbacks.saved(1, "ckpt/step_1")
    callbacks.train_end("results")
    assert recorder.calls == [
        ("begin", "cfg"),
        ("validation", 0, {"validation/accuracy": 0.25}),
        ("step", 1, {"train/reward": 0.5}),
        ("save", 1, Path("ckpt/step_1")),
        ("end", "results"),
    ]
    assert only.steps == [1] and callbacks.history == [{"train/reward": 0.5}]


def test_an_object_with_no_hook_is_refused():
    with pytest.raises(TypeError, match=r"callbacks\[1\]: .* has none of the hooks on_train_begin"):
        Callbacks([OnlySteps(), object()])


def _rank_zero(remote: RemoteEvents, steps: int) -> None:
    for step in range(1, steps + 1):
        remote.step_end(step, {"train/reward": step / 10})
        if step % 2 == 0:
            remote.validation_end(step, {"validation/accuracy": step / 100})
    remote.saved(steps, "ckpt/step_%d" % steps)


def test_events_from_another_process_reach_the_callbacks_in_order():
    recorder = Recorder()
    callbacks = Callbacks([recorder])
    with EventListener(callbacks) as remote:
        process = multiprocessing.get_context("spawn").Process(target=_rank_zero, args=(remote, 4))
        process.start()
        process.join(60)
        assert process.exitcode == 0
    assert [c[:2] for c in recorder.calls] == [
        ("step", 1),
        ("step", 2),
        ("validation", 2),
        ("step", 3),
        ("step", 4),
        ("validation", 4),
        ("save", 4),
    ]
    assert [h["train/reward"] for h in callbacks.history] == [0.1, 0.2, 0.3, 0.4]


def test_a_run_that_sent_nothing_ends_without_waiting():
    with EventListener(Callbacks([])):
        pass  # no rank connected: leaving must not block on the accept


def test_a_callback_that_raises_is_raised_once_the_ranks_are_done():
    class Fails:
        def on_step_end(self, step, metrics):
            raise ValueError(f"no step {step} today")

    with pytest.raises(ValueError, match="no step 1 today"):
        with EventListener(Callbacks([Fails()])) as remote:
            process = multiprocessing.get_context("spawn").Process(target=_rank_zero, args=(remote, 2))
            process.start()
            process.join(60)


def test_a_connection_without_the_key_is_dropped():
    from multiprocessing import AuthenticationError
    from multiprocessing.connection import Client

    recorder = Recorder()
    with EventListener(Callbacks([recorder])) as remote:
        with pytest.raises(AuthenticationError):
            Client(remote.address, authkey=b"not the key")
        remote.step_end(1, {"train/reward": 1.0})  # the real rank still gets through afterwards
        remote._conn.close()
    assert recorder.calls == [("step", 1, {"train/reward": 1.0})]


def test_rank_zero_that_cannot_reach_the_caller_says_so_once_and_trains_on(capsys):
    import socket

    with socket.socket() as probe:  # a loopback port nobody listens on: what rank 0 on another machine meets
        probe.bind(("127.0.0.1", 0))
        address = probe.getsockname()
    remote = RemoteEvents(address, b"key")
    remote.step_end(1, {"train/reward": 1.0})
    remote.step_end(2, {"train/reward": 1.0})
    assert capsys.readouterr().out.count("callbacks: the process that made the trainer is on another machine") == 1
