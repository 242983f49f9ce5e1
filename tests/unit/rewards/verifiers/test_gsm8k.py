"""GSM8K reward: correctness on the real test set, answer formats, hostile inputs, threads."""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import dtppo.rewards.verifiers.gsm8k as reward_module
from dtppo.data.answers import extract_gsm8k_answer
from dtppo.rewards.verifiers.gsm8k import gsm8k_reward
from tests.support.recipes import REPO

GSM8K_TEST = REPO / "tests/data/gsm8k/test.jsonl"  # GSM8K's first 300 test rows

# (response, ground truth, expected reward)
FORMATS = [
    ("\\boxed{18}", "18", 1.0),
    ("So the total is \\boxed{18}.", "18", 1.0),
    ("The answer is 18.", "18", 1.0),
    ("The final answer is: $18$", "18", 1.0),
    ("#### 18", "18", 1.0),
    ("18 apples", "18", 1.0),
    ("She has 3 bags, so 18 apples", "18", 1.0),
    ("$\\frac{36}{2}$", "18", 1.0),
    ("\\boxed{\\dfrac{36}{2}}", "18", 1.0),
    ("\\boxed{2 \\cdot 9}", "18", 1.0),
    ("\\boxed{18 \\text{ apples}}", "18", 1.0),
    ("#### 1,000", "1000", 1.0),
    ("#### 1000", "1,000", 1.0),
    ("The answer is 1\\,000.", "1000", 1.0),
    ("#### 18.0", "18", 1.0),
    ("#### $18.00", "18", 1.0),
    ("#### 50%", "50", 1.0),
    ("#### -3", "-3", 1.0),
    ("The change is \\boxed{-3}", "-3", 1.0),
    ("The temperature fell to \u22123 degrees", "-3", 1.0),
    ("#### 72\nCheck: 5 apples", "72", 1.0),
    ("\\boxed{5} is wrong; #### 72", "72", 1.0),
    ("#### \uff17\uff12", "72", 1.0),  # full-width digits fold to ASCII under NFKC
    ("#### \u0667\u0662", "72", 0.0),  # Arabic-Indic digits are not accepted
    ("#### 72\nCheck: 5 apples", "5", 0.0),
    ("#### 17", "18", 0.0),
    ("\\boxed{19}", "18", 0.0),
    ("The answer is 18.5", "18", 0.0),
    ("$\\frac{35}{2}$", "18", 0.0),
    ("#### 3", "-3", 0.0),
    ("#### 100", "1,000", 0.0),
    ("I don't know", "18", 0.0),
    # digits glued inside a word are not a stand-alone answer (a random BPE sample once scored 1.0 this way)
    ("the shel5orm", "5", 0.0),
    ("an mp3", "3", 0.0),
    ("H2O", "2", 0.0),
    ("It weighs 5kg", "5", 1.0),
    ("", "18", 0.0),
    (None, "18", 0.0),
    ("#### 18", None, 0.0),
    (18, "18", 0.0),
]


@functools.cache
def _hostile_inputs() -> dict[str, str]:
    rng = random.Random(0)
    return {
        "power_tower_boxed": "\\boxed{9^{9^{9^{9^9}}}}",
        "power_tower_hashes": "#### 9^{9^{9^{9^9}}}",
        "python_power_tower": "2**2**2**2**2**2",
        "python_power_tower_hashes": "#### 2**2**2**2**2**2",
        "deep_frac": "\\boxed{" + "\\frac{" * 5000 + "1}{2}" * 5000 + "}",
        "deep_frac_bare": "\\frac{" * 5000 + "1}{2}" * 5000,
        "unbalanced_boxed": "\\boxed{" * 10000,
        "mb_of_digits": "7" * 1_000_000,
        "mb_of_digits_hashes": "#### " + "7" * 1_000_000,
        "mb_random": "".join(rng.choices("0123456789{}^\\$#., abcx+-*/\n", k=1_000_000)),
        "binary_garbage": rng.randbytes(1_000_000).decode("utf-8", errors="replace"),
        "huge_answer": "#### " + "9" * 10000,
        "huge_boxed": "\\boxed{" + "9" * 10000 + "}",
        "nul_bytes": "\x00" * 1_000_000,
        "nul_split_answer": "#### 7\x002\x00",  # reads as 7, never as 72
        "many_commas": "1," * 500_000 + "000^",
        "spaces_then_caret": "1" + " " * 1_000_000 + "^2",
        "answer_is_spam": "the answer is " * 100_000,
    }


@pytest.fixture(scope="module")
def gsm8k_rows() -> list[dict]:
    with GSM8K_TEST.open() as f:
        return [json.loads(line) for line in f]


def test_reference_solutions_score_one_and_wrong_numbers_zero(gsm8k_rows):
    assert len(gsm8k_rows) == 300
    for row in gsm8k_rows:
        gt = extract_gsm8k_answer(row["answer"])
        assert gsm8k_reward(row["answer"], gt) == 1.0, row["answer"]
        assert gsm8k_reward(row["answer"], str(int(gt) + 1)) == 0.0, row["answer"]


@pytest.mark.parametrize(("response", "ground_truth", "expected"), FORMATS)
def test_formats(response, ground_truth, expected):
    assert gsm8k_reward(response, ground_truth) == expected


def test_fbox_is_a_box_as_boxed_is():
    """Both verifiers read boxes with the one scanner (``dtppo.data.answers.last_boxed``): ``\\fbox{}`` holds a final
    answer as ``\\boxed{}`` does, the last box of either kind is the one read, and ``####`` still comes first."""
    assert gsm8k_reward("So the total is \\fbox{18}.", "18") == 1.0
    assert gsm8k_reward("\\boxed{5}, no: \\fbox{18}", "18") == 1.0
    assert gsm8k_reward("\\fbox{5}, no: \\boxed{18}", "18") == 1.0
    assert gsm8k_reward("\\boxed{18}, no: \\fbox{5}", "18") == 0.0
    assert gsm8k_reward("#### 18\n\\fbox{5}", "18") == 1.0


@pytest.mark.parametrize("name", sorted(_hostile_inputs()))
def test_hostile_inputs_are_zero_and_fast(name):
    text = _hostile_inputs()[name]
    # Random text may legitimately end in a small number; use one it cannot end in.
    random_text = name in ("mb_random", "binary_garbage")
    for ground_truth in ("123456789",) if random_text else ("72", "9", "2", "1000"):
        start = time.perf_counter()
        assert gsm8k_reward(text, ground_truth) == 0.0
        assert time.perf_counter() - start < 2.0
    start = time.perf_counter()
    assert gsm8k_reward("#### 72", text) == 0.0  # hostile ground truth too
    assert time.perf_counter() - start < 2.0


def _all_cases() -> list[tuple]:
    hostile = [(text, "72") for text in _hostile_inputs().values()]
    return [(r, gt) for r, gt, _ in FORMATS] + hostile


def test_thread_matches_main_thread():
    cases = _all_cases()
    expected = [gsm8k_reward(r, gt) for r, gt in cases]
    got: list[float] = []
    worker = threading.Thread(target=lambda: got.extend(gsm8k_reward(r, gt) for r, gt in cases))
    worker.start()
    worker.join(timeout=60)
    assert got == expected
    assert 1.0 in expected and 0.0 in expected


def test_thread_pool_matches_main_thread():
    latex = [
        ("$\\frac{36}{2}$", "18"),
        ("\\boxed{\\dfrac{35}{2}}", "18"),
        ("\\boxed{2 \\cdot 9}", "18"),
    ]
    cases = _all_cases() + latex * 8
    expected = [gsm8k_reward(r, gt) for r, gt in cases]
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda case: gsm8k_reward(*case), cases))
    assert got == expected
    assert [gsm8k_reward(r, gt) for r, gt in latex] == [1.0, 0.0, 1.0]


def test_callers_pending_alarm_survives():
    """math-verify's own timeout would cancel a SIGALRM the caller armed; the reward avoids it."""
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(True))
    try:
        signal.setitimer(signal.ITIMER_REAL, 100.0)
        assert gsm8k_reward("$\\frac{36}{2}$", "18") == 1.0
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 90.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not fired


def test_subprocess():
    src = Path(reward_module.__file__).resolve().parents[3]
    pythonpath = os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": pythonpath}
    code = (
        "from dtppo.rewards.verifiers.gsm8k import gsm8k_reward as r\n"
        "print(r('$\\\\frac{36}{2}$', '18'), r('#### 72', '72'), r('\\\\boxed{9^{9^9}}', '9'))"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1.0", "1.0", "0.0"]
