"""Reward functions that fail the ways user code fails (tests/unit/usercode/test_pool_bounds.py and
tests/functional/test_reward_failures_cli.py load them by path): a crash, a segfault, allocation without end, a fork,
a flaky service, a flood of output, a hang."""

import ctypes
import os
import time


def ok(completions, **kwargs):
    return [1.0] * len(completions)


def zeros(completions, **kwargs):
    return [0.0] * len(completions)  # every answer wrong: a verdict, not a failure


def exits(completions, **kwargs):
    os._exit(3)  # what a crash in a C extension or a killed process looks like from outside


def segfault(completions, **kwargs):
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def allocates(completions, **kwargs):
    """Holds ``ALLOC_MIB`` (default 4096) MiB, in 64 MiB blocks: fails under a smaller memory limit."""
    blocks = [bytearray(64 * 2**20) for _ in range(int(os.environ.get("ALLOC_MIB", "4096")) // 64)]
    return [float(len(blocks))] * len(completions)


def forks_and_exits(completions, **kwargs):
    if os.fork() > 0:
        os._exit(0)  # the scoring process leaves (a daemonising library); its copy goes on
    return [1.0] * len(completions)


def forks_and_returns(completions, **kwargs):
    os.fork()  # both copies return from here: only the scoring process may answer
    return [1.0] * len(completions)


def flaky(completions, **kwargs):
    """Every 10th call across all processes raises, as a sandbox service that drops one request in ten: the calls
    are counted as bytes appended to the file ``FLAKY_COUNTER`` names (an O_APPEND write is atomic, and leaves the
    descriptor's offset just past this call's byte)."""
    fd = os.open(os.environ["FLAKY_COUNTER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, b".")
        calls = os.lseek(fd, 0, os.SEEK_CUR)
    finally:
        os.close(fd)
    if calls % 10 == 0:
        raise ConnectionError(f"sandbox dropped request {calls}")
    return [float(len(c) % 2) for c in completions]


def chatty(completions, **kwargs):
    for _ in range(20_000):
        print("x" * 99)  # 2 MB through Python's stdout
    os.write(2, b"y" * 1_000_000)  # 1 MB straight to the stderr descriptor, as C code would
    return [1.0] * len(completions)


def hangs(completions, **kwargs):
    time.sleep(3600)
