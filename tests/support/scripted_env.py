"""Environments for the episode tests: a scripted calculator that pays 0.5 per call and 1.0 for an answer, and
ones that fail in each way an environment can (``tests/unit/envs/test_client.py``; loaded by path)."""

import os
import re
import time


class Scripted:
    def __init__(self, reward_per_call: float = 0.5, names=()):
        self.reward_per_call = reward_per_call

    def reset(self, row):
        return {"calls": 0, "row": row}

    def step(self, state, text):
        call = re.search(r"<calc>(\d+)([+*])(\d+)</calc>$", text)
        if call is None:
            return None, 1.0 if text.startswith("####") else 0.0, True
        a, op, b = int(call.group(1)), call.group(2), int(call.group(3))
        state["calls"] += 1
        return f"<result>{a + b if op == '+' else a * b}</result>\n", self.reward_per_call, False


class Raises(Scripted):
    def step(self, state, text):
        raise KeyError("no tool")


class BadReturn(Scripted):
    def step(self, state, text):
        return "obs", 1.0  # two values, not three


class NanReward(Scripted):
    def step(self, state, text):
        return None, float("nan"), True


class Hangs(Scripted):
    def step(self, state, text):
        time.sleep(60)


class Dies(Scripted):
    def step(self, state, text):
        os._exit(3)


class BadInit:
    def __init__(self):
        raise RuntimeError("no license")


class Segfaults(Scripted):
    def step(self, state, text):
        import ctypes

        ctypes.string_at(0)


class Hoards(Scripted):
    def step(self, state, text):
        state["hoard"] = [bytearray(64 * 2**20) for _ in range(64)]  # 4 GiB
        return None, 0.0, True


class Chatty(Scripted):
    def step(self, state, text):
        os.write(1, b"z" * 1_000_000)
        return None, 0.0, True
