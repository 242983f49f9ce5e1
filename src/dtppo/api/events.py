"""A run's events for its caller's callbacks, in the process that made the trainer.

``Callbacks`` calls each callback's hooks (TRL's ``TrainerCallback`` names: ``on_train_begin``, ``on_step_end``,
``on_validation_end``, ``on_save``, ``on_train_end``) with keyword arguments, and keeps each step's metrics. Where rank
0 runs in this process it is told directly; where it is another process (local ranks, Ray on this machine) it sends
its events over an authenticated connection on the loopback interface (``EventListener``), and a thread of this
process hands them to the callbacks in order, so a callback never runs in a rank."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

from dtppo.config import Config

HOOKS = ("on_train_begin", "on_step_end", "on_validation_end", "on_save", "on_train_end")
_JOIN_S = 60.0  # how long the ranks' last events may take to arrive once the ranks are done
_FLAG_S = 0.2  # how long an accept that returned may take to say so


class Callbacks:
    """The caller's callbacks (each an object with any of ``HOOKS``) and the metrics of each step they were told
    (``history``); the run's ``RunEvents``."""

    def __init__(self, callbacks: Iterable[Any]):
        self.callbacks = list(callbacks)
        for i, callback in enumerate(self.callbacks):
            if not any(callable(getattr(callback, hook, None)) for hook in HOOKS):
                raise TypeError(f"callbacks[{i}]: {callback!r} has none of the hooks {', '.join(HOOKS)}")
        self.history: list[dict[str, float]] = []

    def _call(self, hook: str, **arguments: Any) -> None:
        for callback in self.callbacks:
            method = getattr(callback, hook, None)
            if callable(method):
                method(**arguments)

    def train_begin(self, config: Config) -> None:
        self._call("on_train_begin", config=config)

    def step_end(self, step: int, metrics: dict[str, float]) -> None:
        self.history.append(dict(metrics))
        self._call("on_step_end", step=step, metrics=dict(metrics))

    def validation_end(self, step: int, metrics: dict[str, float]) -> None:
        self._call("on_validation_end", step=step, metrics=dict(metrics))

    def saved(self, step: int, path: Path) -> None:
        self._call("on_save", step=step, path=Path(path))

    def train_end(self, results: Any) -> None:
        self._call("on_train_end", results=results)


class RemoteEvents:
    """Rank 0's side: each event sent to the ``EventListener`` at ``address`` (connected at the first event)."""

    def __init__(self, address: tuple[str, int], authkey: bytes):
        self.address, self.authkey = address, authkey
        self._conn: Connection | None = None
        self._unreachable = False

    def __getstate__(self) -> dict:
        return {"address": self.address, "authkey": self.authkey, "_conn": None, "_unreachable": False}

    def _send(self, *event: Any) -> None:
        if self._unreachable:
            return
        if self._conn is None:
            try:
                self._conn = Client(self.address, authkey=self.authkey)
            except ConnectionError:  # rank 0 on another machine than the caller: the listener is loopback only
                self._unreachable = True
                print(
                    "callbacks: the process that made the trainer is on another machine (its events listen on "
                    "loopback only): the steps are in logger.log_dir",
                    flush=True,
                )
                return
        self._conn.send(event)

    def step_end(self, step: int, metrics: dict[str, float]) -> None:
        self._send("step_end", step, metrics)

    def validation_end(self, step: int, metrics: dict[str, float]) -> None:
        self._send("validation_end", step, metrics)

    def saved(self, step: int, path: Path) -> None:
        self._send("saved", step, str(path))


class EventListener:
    """This process's side: a listener on the loopback interface with a random key, and a thread that hands what
    rank 0 sends to ``callbacks``. Used as a context around the launch; an exception a callback raised is raised on
    leaving (the ranks run on meanwhile: they are other processes)."""

    def __init__(self, callbacks: Callbacks):
        self.callbacks = callbacks
        key = os.urandom(32)
        self.listener = Listener(("127.0.0.1", 0), authkey=key)
        self.remote = RemoteEvents(self.listener.address, key)
        self.accepted = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, name="dtppo-events", daemon=True)

    def __enter__(self) -> RemoteEvents:
        self.thread.start()
        return self.remote

    def _serve(self) -> None:
        try:
            conn = self._accept()
            self.accepted.set()
            with conn:
                while True:
                    kind, step, payload = conn.recv()
                    if self.error is None:
                        self._dispatch(kind, step, payload)
        except (EOFError, OSError):  # rank 0 is done (or never sent anything and we woke ourselves up)
            pass

    def _accept(self) -> Connection:
        """The first connection that knows the key (another local process's attempt is dropped)."""
        while True:
            try:
                return self.listener.accept()
            except AuthenticationError:
                continue

    def _dispatch(self, kind: str, step: int, payload: Any) -> None:
        try:
            getattr(self.callbacks, kind)(step, payload)
        except BaseException as err:  # the caller's code: raised in the caller's thread once the ranks are done
            self.error = err

    def __exit__(self, *exc_info: Any) -> None:
        # The ranks are done: rank 0's connection, if it made one, was accepted already (its handshake needs the
        # accept), so a moment covers the flag; otherwise nobody will connect and the accept is woken up, from a
        # thread of its own so that nothing here can block on it.
        if not self.accepted.wait(_FLAG_S):
            threading.Thread(target=self._wake, name="dtppo-events-wake", daemon=True).start()
        self.thread.join(_JOIN_S)
        self.listener.close()
        if self.error is not None and exc_info[0] is None:
            raise self.error

    def _wake(self) -> None:
        try:
            Client(self.listener.address, authkey=self.remote.authkey).close()
        except (OSError, EOFError, AuthenticationError):
            pass
