"""Arithmetic-step verifier: hand-made chains, look-alikes, GSM8K's annotated solutions, tiny_math's worked lines,
both reward modes, random chains with planted errors, hostile inputs."""

from __future__ import annotations

import json
import random
import re
import time
from fractions import Fraction

import pytest

from dtppo.config import TinyMathConfig
from dtppo.data.answers import normalise
from dtppo.data.tiny_math import TinyMathStream
from dtppo.rewards.verifiers.steps import Step, _normalised, find_steps, step_rewards
from tests.support.recipes import REPO

GSM8K_TRAIN = REPO / "tests/data/gsm8k/train.jsonl"  # GSM8K's first 1,500 training rows
ANNOTATION = re.compile(r"<<([^<>\n]*)>>")

# (text, [(expression, correct), ...] in order)
CHAINS = [
    ("3 + 4 = 7", [("3 + 4 = 7", True)]),
    ("3 + 4 = 8", [("3 + 4 = 8", False)]),
    ("First 3+4=7, then 7*2=15, so 15-1=14.", [("3+4=7", True), ("7*2=15", False), ("15-1=14", True)]),
    ("1+1=2 2+2=4", [("1+1=2", True), ("2+2=4", True)]),
    # exactness: decimals and division
    ("0.1+0.2=0.3", [("0.1+0.2=0.3", True)]),
    ("7/2=3.5", [("7/2=3.5", True)]),
    ("10/3=3.33", [("10/3=3.33", False)]),
    ("10/4=2.50", [("10/4=2.50", True)]),
    ("1/3*3=1", [("1/3*3=1", True)]),
    ("20*.05=1", [("20*.05=1", True)]),
    ("5/0=0", [("5/0=0", False)]),
    # chains: one step, the usual precedence, left to right within a level
    ("2+3+4=9", [("2+3+4=9", True)]),
    ("10-3-2=5", [("10-3-2=5", True)]),
    ("100/10/2=5", [("100/10/2=5", True)]),
    ("2+3*4=14", [("2+3*4=14", True)]),
    ("2+3*4=20", [("2+3*4=20", False)]),
    ("(2+3)*4=20", [("(2+3)*4=20", True)]),
    ("-(3+4)=-7", [("-(3+4)=-7", True)]),
    # glued digits: a result runs on as far as the answer reader's numbers do
    ("3+4=712", [("3+4=712", False)]),
    ("3+4=7apples", [("3+4=7", True)]),
    ("3+4=7.5", [("3+4=7.5", False)]),
    ("3+4=7.", [("3+4=7", True)]),
    ("3+4=7,000", [("3+4=7,000", False)]),
    ("3+4=7\u200b12", [("3+4=712", False)]),  # a zero-width space cannot split 712
    ("mp3+4=7", []),
    ("3+4=7e1", []),
    # operators, signs, separators, currency
    ("3 \u00d7 4 = 12", [("3 \u00d7 4 = 12", True)]),
    ("12 \u00f7 4 = 3", [("12 \u00f7 4 = 3", True)]),
    ("3x4=12", [("3x4=12", True)]),
    ("0.2 x 50 = 10", [("0.2 x 50 = 10", True)]),
    ("x = -3 + 5 = 2", [("-3 + 5 = 2", True)]),
    ("5 * -3 = -15", [("5 * -3 = -15", True)]),
    ("5 - -3 = 8", [("5 - -3 = 8", True)]),
    ("3-5=-2", [("3-5=-2", True)]),
    ("1,000 + 2,500 = 3,500", [("1,000 + 2,500 = 3,500", True)]),
    ("$12 + $5 = $17", [("$12 + $5 = $17", True)]),
    ("12 x $2 = $24", [("12 x $2 = $24", True)]),
    # comparisons after the result are part of the step
    ("5+3=8<=20", [("5+3=8<=20", True)]),
    ("5+3=8>20", [("5+3=8>20", False)]),
    ("5+3=9<=20", [("5+3=9<=20", False)]),
    ("5+3=8<=7", [("5+3=8<=7", False)]),
    ("5+3=8 \u2264 20", [("5+3=8 \u2264 20", True)]),
    # annotations: the body is the step, the text after ">>" is not a second one
    ("Natalia sold 48/2 = <<48/2=24>>24 clips", [("48/2=24", True)]),
    ("She sold 48/2 = <<48/2=25>>24 clips", [("48/2=25", False)]),
    ("<<+30+46=76>>76", [("+30+46=76", True)]),
    ("<<15=15>>15 and <<7//2=3>>3", []),
    # not read: an unfinished chain, powers, percents, algebra, mixed numbers, clock times, approximations
    ("2*3+4 = 6+4 = 10", [("6+4 = 10", True)]),
    ("2^3+1=9", []),
    ("2**3+1=9", []),
    ("50% + 10 = 60", []),
    ("3x-5=16", []),
    ("100/5 = 5A/5", []),
    ("8 x 1 1/2 = 12", []),
    ("3 / 4 * 2 = 1 1/2 feet", []),
    ("0900-0130 = 0730", []),
    ("10/3\u22483.33", []),
    ("3+4==7", []),
    ("5 kg + 3 kg = 8 kg", []),
    ("x+1=5", []),
    ("15 = 15", []),
    # no steps at all
    ("", []),
    ("The answer is 7.\n#### 7", []),
]

# Look-alikes fold as the answer reader folds them: (text, expression read, correct)
LOOK_ALIKES = [
    ("\uff13+\uff14=\uff17", "3+4=7", True),  # full-width digits
    ("\uff13\uff0b\uff14\uff1d\uff17", "3+4=7", True),  # full-width plus and equals too
    ("9\u22124=5", "9-4=5", True),  # U+2212 minus
    ("3\u22125=\u22122", "3-5=-2", True),
    ("\U0001d7d1+\U0001d7d2=\U0001d7d5", "3+4=7", True),  # mathematical bold digits
    ("3 + 4 = **7**", "3 + 4 = 7", True),  # markdown bold unwrapped
    ("3 + 4 = **8**", "3 + 4 = 8", False),
    ("1\u00a0+\u00a01\u00a0=\u00a02", "1 + 1 = 2", True),  # no-break spaces
    ("3+4=\u20067", None, None),  # a six-per-em space is not folded
]


def _read(text: str) -> list[tuple[str, bool]]:
    return [(step.expression, step.correct) for step in find_steps(text)]


@pytest.mark.parametrize(("text", "expected"), CHAINS)
def test_hand_made_chains(text, expected):
    steps = find_steps(text)
    assert [(step.expression, step.correct) for step in steps] == expected
    for step in steps:  # ASCII texts: the span is exactly the expression, its last character text[end - 1]
        assert 0 <= step.start < step.end <= len(text)
        if text.isascii() and "**" not in text:
            assert text[step.start : step.end] == step.expression
            assert text[step.end - 1] == step.expression[-1]


@pytest.mark.parametrize(("text", "expression", "correct"), LOOK_ALIKES)
def test_look_alikes_read_as_the_answer_reader_reads_them(text, expression, correct):
    expected = [] if expression is None else [(expression, correct)]
    assert _read(text) == expected


def test_end_offsets_point_into_the_original_text():
    text = "Sum: \uff13+\uff14=\uff17! Then 3 + 4 = **7** apples; 3+4=7\u200b12 too."
    steps = find_steps(text)
    assert [(s.start, s.end) for s in steps] == [(5, 10), (17, 28), (39, 47)]
    assert [text[s.end - 1] for s in steps] == ["\uff17", "7", "2"]
    assert [s.correct for s in steps] == [True, True, False]
    text = "Sum:\u200b\u200b 3+4=7"  # characters dropped before a step shift nothing
    assert find_steps(text) == [Step(start=7, end=12, expression="3+4=7", correct=True)]
    assert find_steps("x\u200b3+4=7") == []  # once the invisible character is dropped, "x3" is glued


@pytest.mark.parametrize(
    "text",
    [
        "plain 3+4=7",
        "\uff13\uff0b\uff14 **7** and 2**2**2",
        "a\u200bb\u2212c \ufeff**bold** x**y**",
        "**\uff17**\u00a0\U0001d7d5 \u0663",
        "****",
    ],
)
def test_the_text_read_is_the_answer_readers_normalise(text):
    normal, origin = _normalised(text)
    assert normal == normalise(text)
    assert len(origin) == len(normal)
    assert list(origin) == sorted(origin) and all(0 <= i < len(text) for i in origin)


def _gsm8k_rows(count: int) -> list[dict]:
    with GSM8K_TRAIN.open() as rows:
        return [json.loads(line) for line, _ in zip(rows, range(count), strict=False)]


def _check_annotations(solution: str) -> int:
    """Every annotation with an operator, floor division aside, is one correct step whose span is its body;
    returns how many there are."""
    steps = {step.start: step for step in find_steps(solution)}
    count = 0
    for match in ANNOTATION.finditer(solution):
        body = match.group(1)
        if not re.search(r"[-+*/]", body.lstrip("+-")) or "//" in body:
            assert match.start(1) not in steps  # "<<15=15>>" has no operator, "<<560//10=56>>" is not read
            continue
        step = steps[match.start(1)]
        assert (step.expression, step.end, step.correct) == (body, match.end(1), True), solution
        count += 1
    return count


def test_gsm8k_first_50_reference_solutions_verify():
    rows = _gsm8k_rows(50)
    assert sum(_check_annotations(row["answer"]) for row in rows) == 161  # every annotation of the 50 rows
    steps = [step for row in rows for step in find_steps(row["answer"])]
    assert len(steps) == 168 and all(step.correct for step in steps)  # the 161 and 7 prose steps


def test_gsm8k_all_annotations_verify_and_the_wrong_prose_steps_are_the_datasets_own():
    """Over 1,500 rows: 4,753 annotations, 76 without an operator (no step) and one floor division
    (``<<560//10=56>>``, not read); the other 4,676 are correct steps. The 153 prose steps are right but for the
    dataset's own slips and unit changes, and one mixed number written "1 and 1/4" (read as the step "1/4 = 15")."""
    rows = _gsm8k_rows(1500)
    assert sum(len(ANNOTATION.findall(row["answer"])) for row in rows) == 4753
    assert sum(_check_annotations(row["answer"]) for row in rows) == 4753 - 76 - 1
    steps = [(i, step) for i, row in enumerate(rows) for step in find_steps(row["answer"])]
    assert len(steps) == 4676 + 153
    assert [(i, step.expression) for i, step in steps if not step.correct] == [
        (167, "192*100=$1920"),  # a slip: 19,200
        (198, "6/3=.5"),  # a slip: 3/6
        (502, "3/1=1"),
        (623, "1/4 = 15"),  # "12 x 1 and 1/4 = 15": a mixed number in words
        (716, "100 * 0.75 = $0.75"),  # cents to dollars inside the step
        (874, "$1 / 2 = 50"),  # "$1 / 2 = 50 cents"
    ]


TINY = [
    TinyMathConfig(kind="word_problems", max_ops=4, hard_fraction=0.3),
    TinyMathConfig(kind="running_sum", max_ops=12),
]


def _solutions(cfg: TinyMathConfig) -> list[str]:
    stream = TinyMathStream(cfg, seed=7)
    return [stream[i].solution for i in range(200)]


def _line_spans(solution: str) -> list[tuple[int, int]]:
    """Each worked line's (start, end), the ``####`` line left out."""
    spans, start = [], 0
    for line in solution.split("\n"):
        if not line.startswith("####"):
            spans.append((start, start + len(line)))
        start += len(line) + 1
    return spans


@pytest.mark.parametrize("cfg", TINY, ids=lambda cfg: cfg.kind)
def test_tiny_math_worked_lines_are_every_step_and_correct(cfg):
    total = 0
    for solution in _solutions(cfg):
        steps, spans = find_steps(solution), _line_spans(solution)
        assert [(s.start, s.end) for s in steps] == spans, solution
        assert [s.expression for s in steps] == [solution[a:b] for a, b in spans]
        assert all(s.correct for s in steps), solution
        total += len(steps)
    assert total > (300 if cfg.kind == "word_problems" else 1000)


@pytest.mark.parametrize("cfg", TINY, ids=lambda cfg: cfg.kind)
def test_tiny_math_one_corrupted_digit_makes_exactly_that_step_wrong(cfg):
    rng = random.Random(0)
    for solution in _solutions(cfg):
        spans = _line_spans(solution)
        line = rng.randrange(len(spans))
        start, end = spans[line]
        result = re.search(r"=\s*([0-9]+)", solution[start:end])
        digit = start + result.end(1) - 1  # the result's last digit
        corrupted = solution[:digit] + str((int(solution[digit]) + 1) % 10) + solution[digit + 1 :]
        steps = find_steps(corrupted)
        assert len(steps) == len(spans)
        assert [i for i, step in enumerate(steps) if not step.correct] == [line], corrupted
        assert step_rewards(corrupted, "first_error") == [(end, -1.0)]


def test_running_sum_a_wrong_comparison_is_a_wrong_step():
    solution = "5+3=8<=20\n8+3=11<=20\n11+3=14<=20\n14+3=17<=20\n17+3=20<=20\n20+3=23>20\n#### 23"
    assert all(step.correct for step in find_steps(solution))
    flipped = solution.replace("17+3=20<=20", "17+3=20>20")
    assert [step.correct for step in find_steps(flipped)] == [True, True, True, True, False, True]
    assert step_rewards(flipped, "first_error", penalty=-2.0) == [(flipped.index("20>20") + 5, -2.0)]


def test_step_rewards_both_modes_exact_numbers():
    text = "First 3+4=7, then 7*2=15, so 15-1=14."
    ends = [s.end for s in find_steps(text)]
    assert ends == [11, 24, 36]
    assert step_rewards(text, "per_step") == [(11, 1 / 3), (36, 1 / 3)]
    assert step_rewards(text, "per_step", reward=3.0) == [(11, 1.0), (36, 1.0)]
    assert step_rewards(text, "first_error") == [(24, -1.0)]
    assert step_rewards(text, "first_error", penalty=-0.5) == [(24, -0.5)]
    right = "1+1=2\n2+2=4\n4+4=8\n8+8=16"
    assert step_rewards(right, "per_step") == [(5, 0.25), (11, 0.25), (17, 0.25), (24, 0.25)]
    assert sum(r for _, r in step_rewards(right, "per_step", reward=0.7)) == pytest.approx(0.7)
    assert step_rewards(right, "first_error") == []
    wrong = "1+1=3\n2+2=5"
    assert step_rewards(wrong, "per_step") == [] and step_rewards(wrong, "first_error") == [(5, -1.0)]
    for mode in ("per_step", "first_error"):
        assert step_rewards("no steps here, #### 7", mode) == []
        assert step_rewards("", mode) == []
    with pytest.raises(ValueError, match="mode"):
        step_rewards(text, "every_step")


def test_non_strings_have_no_steps():
    assert find_steps(None) == [] and find_steps(b"3+4=7") == [] and find_steps(7) == []


def _decimal(value: Fraction) -> str:
    """``value`` (a denominator of 2s and 5s) written out exactly as a decimal."""
    places = 0
    while (value * 10**places).denominator != 1:
        places += 1
    digits = f"{abs(value.numerator * 10**places // value.denominator):0{places + 1}d}"
    text = digits[: len(digits) - places] + ("." + digits[-places:] if places else "")
    return ("-" if value < 0 else "") + text


def _random_step(rng: random.Random) -> tuple[str, Fraction]:
    """A random left side and its exact value (divisors keep every value a finite decimal)."""
    python, shown = [], []
    for i in range(rng.randint(2, 4)):
        if i:
            op = rng.choice("+-*/\u00d7\u00f7x")
            python.append({"\u00d7": "*", "x": "*", "\u00f7": "/"}.get(op, op))
            shown.append(rng.choice(["", " "]) + op + rng.choice(["", " "]))
        divisor = bool(python) and python[-1] == "/"
        value = Fraction(rng.choice([1, 2, 4, 5, 8, 10, 20, 25])) if divisor else Fraction(rng.randint(0, 999))
        if not divisor and rng.random() < 0.3:
            value /= rng.choice([10, 100])
        python.append(f"Fraction({value.numerator}, {value.denominator})")
        shown.append(rng.choice(["", "$"]) + _decimal(value))
    return "".join(shown), eval("".join(python), {"Fraction": Fraction})  # the oracle: Python's precedence


def test_random_chains_the_wrong_steps_found_are_the_ones_perturbed():
    rng = random.Random(2024)
    # not a bare space: "= 2 6/2" is the mixed number 2 6/2, which is not read
    separators = [", then ", ". Next, ", "\n", "; so ", " and ", "  so "]
    for _ in range(400):
        text, spans, perturbed = rng.choice(["", "We get "]), [], set()
        for i in range(rng.randint(1, 8)):
            left, value = _random_step(rng)
            if rng.random() < 0.3:
                perturbed.add(i)
                value += rng.choice([1, -1, Fraction(1, 100), Fraction(-1, 10), 1000])
            step = f"{left}{rng.choice(['=', ' = '])}{_decimal(value)}"
            spans.append((len(text), len(text) + len(step), step))
            text += step + rng.choice(separators)
        steps = find_steps(text)
        assert [(s.start, s.end, s.expression) for s in steps] == spans, text
        assert {i for i, s in enumerate(steps) if not s.correct} == perturbed, text
        share = [r for _, r in step_rewards(text, "per_step")]
        assert len(share) == len(spans) - len(perturbed)
        first = step_rewards(text, "first_error")
        assert first == ([(spans[min(perturbed)][1], -1.0)] if perturbed else [])


@pytest.mark.parametrize(
    "text",
    [
        "(" * 50_000,
        "-(" * 25_000,
        "1+" * 25_000 + "1=2",
        "1+1=2 " * 10_000,
        "1" * 50_000 + "+1=2",
        "1" * 50_000 + "%",
        "<<" * 25_000,
        "<<1+1=2>>" * 5_000,
        "**3+4=7** " * 5_000,
        "\uff13+\uff14=\uff17 " * 5_000,
        "3+4=7" + "a" * 50_000,
        "1 1/" * 12_500,
        "1+1=2<" * 10_000,
    ],
    ids=lambda text: repr(text[:12]),
)
def test_hostile_inputs_are_read_in_bounded_time(text):
    start = time.perf_counter()
    find_steps(text)
    assert time.perf_counter() - start < 2.0
