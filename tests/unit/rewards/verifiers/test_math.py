"""dtppo.rewards.verifiers.math: the MATH answer verifier.

- every hand-written pair of tests/support/math_pairs.py scores its human grade, with the answer given in a box, on a
  ``####`` line, and as the last of two boxes (the earlier one wrong: only the final answer counts);
- the documented math-verify deviations behave as documented;
- non-string inputs (the box scanner itself: tests/unit/data/test_answers.py);
- a hostile catalogue (towers, huge numbers, deep nesting, megabytes, garbage, look-alikes, invisible
  characters, hostile references, pairs past the joint bounds, and the costliest pairs the bounds still
  admit): each scores exactly its expected value within ``BOUND_S`` from cold caches, in the main thread
  and in a worker thread (no SIGALRM timeout there), and the megabyte inputs allocate a bounded amount.

Past a bound an answer scores 0.0 even when it is equal (``(x+1)^{99}`` against ``(1+x)^{99}``): it is
never evaluated. Such cases are marked "past a bound" below.
"""

from __future__ import annotations

import random
import threading
import time
import tracemalloc

import pytest
import sympy
from math_verify import parser as mv_parser

import dtppo.rewards.verifiers.math as math_verifier
from dtppo.data.answers import TAIL_CHARS
from dtppo.rewards.verifiers.math import math_reward
from tests.support.hostile_catalogue import BIG, DEEP, MB, Case
from tests.support.math_pairs import DEVIATIONS, EQUAL, NOT_EQUAL, PAIRS

# One scoring, its input never seen before. What this guards against is a hang: before the joint bounds, one pair
# ran over 100 s inside a single C call. The worst admitted pair takes ~0.15 s idle and ~0.3 s on 2 busy cores,
# and once took 0.61 s inside a full `make test`; 5 s keeps a hang unmistakable without failing on a slow moment.
BOUND_S = 5.0
PEAK_MIB = 4.0  # allocation peak of scoring one megabyte input (the input itself not counted)
WRONG = "-987654321"


def _ids(rows) -> list[str]:
    return [f"{row[0]}|{row[1]}" for row in rows]


def _forms(answer: str, reference: str, expected: float) -> list[str]:
    earlier = reference if expected == NOT_EQUAL else WRONG  # an earlier box never decides
    return [
        f"Simplifying, we find that the answer is $\\boxed{{{answer}}}$.",
        f"Adding the cases up gives the total.\n#### {answer}\n",
        f"A first try gives \\boxed{{{earlier}}}, but it double-counts; in fact \\boxed{{{answer}}}.",
    ]


def test_pair_catalogue_is_large_and_balanced():
    assert len(PAIRS) >= 150
    assert sum(expected == NOT_EQUAL for *_, expected in PAIRS) >= 60
    assert len({(reference, answer) for reference, answer, _ in PAIRS}) == len(PAIRS)


@pytest.mark.parametrize(("reference", "answer", "expected"), PAIRS, ids=_ids(PAIRS))
def test_pair_scores_its_human_grade(reference, answer, expected):
    scores = [math_reward(response, reference) for response in _forms(answer, reference, expected)]
    assert scores == [expected] * 3


@pytest.mark.parametrize(("reference", "answer", "expected"), PAIRS[::7], ids=_ids(PAIRS[::7]))
def test_pair_scores_the_same_in_a_worker_thread(reference, answer, expected):
    assert _in_thread(f"\\boxed{{{answer}}}", reference)[0] == expected


@pytest.mark.parametrize(("reference", "answer", "human", "given"), DEVIATIONS, ids=_ids(DEVIATIONS))
def test_documented_deviation_behaves_as_documented(reference, answer, human, given):
    assert human != given
    assert math_reward(f"\\boxed{{{answer}}}", reference) == given


def test_reference_may_be_boxed():
    assert math_reward("#### 0.5", "\\boxed{\\frac{1}{2}}") == EQUAL
    assert math_reward("#### 0.5", "so $\\boxed{\\frac{1}{2}}$") == EQUAL
    assert math_reward("#### 0.5", "\\fbox{\\frac{1}{2}}") == EQUAL
    assert math_reward("#### 0.5", "\\boxed{\\frac{1}{3}}") == NOT_EQUAL


def test_box_wins_over_hashes_and_an_unclosed_last_box_falls_back_to_them():
    assert math_reward("\\boxed{41}\n#### 42", "42") == NOT_EQUAL
    assert math_reward("#### 42\n\\boxed{41}", "41") == EQUAL
    assert math_reward("#### 42\nthen \\boxed{41", "42") == EQUAL
    assert math_reward("\\boxed{42} and then \\boxed{4", "42") == NOT_EQUAL
    assert math_reward("the answer is 42", "42") == NOT_EQUAL  # neither form: no final answer
    assert math_reward("#### 42 apples\n41", "42") == NOT_EQUAL  # the whole line is the answer


@pytest.mark.parametrize(
    ("response", "reference"),
    [
        (None, "1"),
        ("\\boxed{1}", None),
        (1, "1"),
        ("\\boxed{1}", 1),
        (b"\\boxed{1}", "1"),
        (["\\boxed{1}"], "1"),
        (1.0, 1.0),
        (object(), "1"),
    ],
)
def test_non_strings_score_zero(response, reference):
    assert math_reward(response, reference) == 0.0


def test_cancellation_still_propagates(monkeypatch):
    def interrupt(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(math_verifier, "verify_boxed", interrupt)
    with pytest.raises(KeyboardInterrupt):
        math_reward("\\boxed{0.5}", "\\frac{1}{2}")


def _cases(kind: str, rows: list[tuple[object, object, float]]) -> list[Case]:
    return [Case(kind, f"{kind}-{i:03d}", r, t, e) for i, (r, t, e) in enumerate(rows)]


def _boxed(rows: list[tuple[str, str, float]]) -> list[tuple[str, str, float]]:
    return [(f"\\boxed{{{answer}}}", reference, expected) for answer, reference, expected in rows]


def _towers() -> list[Case]:
    return _cases(
        "tower",
        _boxed(
            [
                ("2^{2^{2^{2^{2}}}}", "2", 0.0),
                ("2^{2^{2^{2^{2}}}}", "2^{65536}", 0.0),
                ("9^{9^{9}}", "9", 0.0),
                ("9^{9^{9}}", "9^{9^{9}}", 0.0),  # past a bound
                ("9^9^9", "9", 0.0),
                ("2^{3}^{2}", "64", 0.0),  # past a bound: chained carets
                ("x^2^3", "x^6", 0.0),  # past a bound
                ("10^{1000000}", "1", 0.0),
                ("10^99999", "1", 0.0),  # latex2sympy reads 10**99999
                ("10^{999}", "1", 0.0),
                ("x^23", "x^{23}", 0.0),
                ("2^{99+99+99+99}", "1", 0.0),
                ("(2^{99})^{99}", "2^{9801}", 0.0),
                ("((x^{9})^{9})^{9}", "x", 0.0),
                ("(a+b+c+d+e+f)^{99}", "1", 0.0),
                ("(a+b+c+d+e+f)^{99}", "(a+b+c+d+e+f)^{99}", 0.0),  # past a bound
                ("(x+1)^{999}", "1", 0.0),
                ("2**2**2**2**2", "65536", 0.0),
                ("\\sqrt[99999]{2}", "1", 0.0),
                ("e^{e^{e^{99}}}", "1", 0.0),
                ("\\exp(\\exp(99))", "1", 0.0),
                ("2^{-}", "1", 0.0),
                ("2^", "1", 0.0),
                ("^{2}", "1", 0.0),
                ("2^{10}", "1024", 1.0),
                ("(2^{3})^{2}", "64", 1.0),
                ("x^{-1}", "\\frac{1}{x}", 1.0),
                ("10^{\\circ}", "10", 1.0),
                ("2^{{{{2}}}}", "4", 1.0),
            ]
        )
        + [("#### 2^9", "512", 1.0)],
    )


def _huge_numbers() -> list[Case]:
    big = "9" * BIG
    return _cases(
        "huge_number",
        [
            ("\\boxed{" + big + "}", big, 0.0),
            ("#### " + big, big, 0.0),
            ("#### " + big, "9", 0.0),
            ("\\boxed{\\frac{" + big + "}{2}}", "1", 0.0),
            (big + "\n#### 42", "42", 1.0),
            ("\\boxed{" + big + "} no: \\boxed{42}", "42", 1.0),
        ]
        + _boxed(
            [
                ("100000!", "1", 0.0),
                ("(5!)!", "1", 0.0),
                ("5!!", "15", 0.0),
                ("999!", "1", 0.0),
                ("9" * 31, "9" * 31, 0.0),  # past a bound: 31 digits
                ("1" + "0" * 29, "10^{29}", 1.0),
                ("99!", "99!", 1.0),
                ("5!", "120", 1.0),
                ("9" * 30 + "^{99}", "1", 0.0),
            ]
        ),
    )


def _deep() -> list[Case]:
    frac = "\\frac{" * DEEP + "1}{2}" * DEEP
    sqrt = "\\sqrt{" * DEEP + "16" + "}" * DEEP
    return _cases(
        "deep",
        [
            ("\\boxed{" + frac + "}", "0.5", 0.0),
            ("#### " + frac, "0.5", 0.0),
            ("\\boxed{" + sqrt + "}", "2", 0.0),
            ("#### " + sqrt, "2", 0.0),
            ("\\boxed{" + "{" * DEEP + "42" + "}" * DEEP + "}", "42", 0.0),
            ("#### " + "(" * DEEP + "42" + ")" * DEEP, "42", 0.0),
            ("\\boxed{" * DEEP + "42" + "}" * DEEP, "42", 1.0),  # the innermost box is the last one
            ("\\boxed{" * 10_000, "42", 0.0),
            ("\\boxed{" * 10_000 + "42}", "42", 1.0),
            ("}" * 10_000 + "\\boxed{42}", "42", 1.0),
        ]
        + _boxed(
            [
                ("\\sqrt{" * 6 + "2" + "}" * 6, "2^{\\frac{1}{64}}", 0.0),  # past a bound: depth 6
                ("\\sqrt{" * 4 + "65536" + "}" * 4, "2", 1.0),
                ("\\frac{1}{" * 4 + "2" + "}" * 4, "2", 1.0),
                ("\\sin(\\sin(\\sin(\\sin(1))))", "1", 0.0),
                ("|x+|y+|z+|x+|y|||||", "1", 0.0),
                ("\\cup".join(f"({i},{i + 1})" for i in range(0, 20, 2)), "x", 0.0),
                ("\\binom{100000}{50000}", "1", 0.0),
                ("1\\pm2\\pm3\\pm4\\pm5\\pm6\\pm7\\pm8", "1", 0.0),
            ]
        ),
    )


def _past_joint_bounds() -> list[Case]:
    """Each side alone is within the per-side bounds; together they would have hung or crawled."""
    return _cases(
        "joint",
        _boxed(
            [
                (
                    "\\log_{3}(\\sin(1))",
                    "999999999999999999999999999999",
                    0.0,
                ),  # logcombine: 3^(10^30), no signal stops it
                ("\\sin^{2}(\\frac{\\pi}{7})+\\cos^{2}(\\frac{\\pi}{7})", "999999999999999999999999999999^{99}", 0.0),
                ("x^{9}+x^{8}+x=1", "x^{9}+x=1", 0.0),  # solving degree 9
                ("y=x^2+2x+1", "(x-1)^2+(y+2)^2=9", 0.0),  # a system of degree 4 + 4
                ("(x-1)^2+(y+2)^2=9", "(x+1)^2+(y-2)^2=9", 0.0),
                ("(x+1)^{30}", "(1+x)^{30}", 0.0),  # past a bound: 64 digits of binomial coefficients
                ("x^4+3x^3-7x+11=0", "x^4+3x^3-7x+12=0", 0.0),
                ("(x+1)^{99}", "(1+x)^{99}", 0.0),  # past a bound
                ("(x+y+z)^{12}", "1", 0.0),
                ("\\frac{x+y}{y+z}+\\frac{y+z}{z+x}+\\frac{z+x}{x+y}", "1", 0.0),
                ("\\frac{x^2+y}{y+z}+\\frac{y+z^2}{z+x}", "(x+y+z)^{8}", 0.0),
                ("(1,2)\\cup(3,4)\\cup(5,6)\\cup(7,8)", "\\{1,2,3,4,5,6,7,8,9,10,11,12,13\\}", 0.0),
                ("\\sin(x+y+z)\\cos(x-y+z)", "1", 0.0),
                ("z^{n+1}5\\%", "\\frac{1}{2}", 0.0),  # nc_simplify recursed for minutes (found by fuzzing)
                ("\\pi^{n+1} 5\\%", "1", 0.0),
            ]
        ),
    )


def _megabytes() -> list[Case]:
    junk = ("lorem \\boxed{ {{ #### ^ \\frac{ 9^9^9 \U0001f600 \u200b " * (MB // 40))[:MB]
    tail = "z" * (TAIL_CHARS + 10)
    return _cases(
        "megabyte",
        [
            (junk + " so \\boxed{\\frac{1}{2}}.", "0.5", 1.0),
            (junk + "\n#### 0.5", "\\frac{1}{2}", 1.0),
            ("\\boxed{\\frac{1}{2}}" + tail, "0.5", 0.0),  # buried before more than TAIL_CHARS
            ("#### 0.5\n" + tail, "0.5", 0.0),
            ("#### 1" + " " * MB, "1", 0.0),
            (junk, "0.5", 0.0),
            ("#### " + "1" * MB, "1", 0.0),
            ("\\boxed{" + "x+" * MB + "x}", "x", 0.0),
            ("\\boxed{" * (MB // 7), "1", 0.0),
            ("#" * MB, "1", 0.0),
            ("\\" * MB, "1", 0.0),
        ],
    )


def _garbage() -> list[Case]:
    rng = random.Random(0)
    rows = []
    for size in (1_000, MB):
        raw = rng.randbytes(size)
        for text in (raw.decode("utf-8", "replace"), raw.decode("latin-1"), raw.decode("utf-8", "surrogateescape")):
            rows += [(text, "1", 0.0), (text + "\n\\boxed{42}", "42", 1.0), (text + "\n#### 42", "42", 1.0)]
    rows += [
        ("\\boxed{4\x002}", "42", 0.0),
        ("\x00" * MB, "0", 0.0),
        ("\\boxed{\x1b[31m42}", "42", 0.0),
        ("\x1b[31m\\boxed{42}\x1b[0m", "42", 1.0),
        ("\\boxed{\ud800}", "1", 0.0),
    ]
    return _cases("garbage", rows)


def _unicode() -> list[Case]:
    def digits(zero: int) -> str:
        return chr(zero + 4) + chr(zero + 2)

    folded = [0xFF10, 0x1D7CE, 0x1D7D8, 0x1D7F6]  # full-width; mathematical bold, double-struck, monospace
    other = [0x0660, 0x06F0, 0x0966, 0x0E50]  # Arabic-Indic, Persian, Devanagari, Thai: never digits
    return _cases(
        "unicode",
        [("\\boxed{" + digits(zero) + "}", "42", 1.0) for zero in folded]
        + [("#### " + digits(zero), "42", 0.0) for zero in other]
        + [("\uff3c\uff42\uff4f\uff58\uff45\uff44\uff5b\uff14\uff12\uff5d", "42", 1.0)]  # full-width box
        + _boxed(
            [
                ("\\frac{\uff11}{\uff12}", "0.5", 1.0),
                ("\u22125", "-5", 1.0),  # minus sign
                ("2\u03c0", "2\\pi", 1.0),
                ("10\u00b0", "10^\\circ", 1.0),
                ("(-\u221e, 2]", "(-\\infty,2]", 1.0),
                ("x \u2264 3", "x \\le 3", 1.0),
                ("\u00b12", "2,-2", 1.0),
                ("4\u00b2", "16", 0.0),  # superscripts stay non-ASCII: never evaluated
                ("4\u00b2", "42", 0.0),
                ("\u2463\u2461", "42", 0.0),  # circled
                ("\u00bd", "0.5", 0.0),
                ("4\u041e", "40", 0.0),  # Cyrillic O
                ("\u221a2", "\\sqrt{2}", 0.0),
            ]
        ),
    )


def _invisible() -> list[Case]:
    rows = []
    for mark in ("\u200b", "\u200d", "\u2060", "\u00ad", "\ufeff", "\u202e", "\u2066"):
        rows += [
            ("\\boxed{4" + mark + "2}", "42", 1.0),
            ("\\boxed{4" + mark + "2}", "4", 0.0),
            ("\\bo" + mark + "xed{\\frac{1}{2}}", "0.5", 1.0),
            ("\\boxed{42}", "4" + mark + "2", 1.0),
        ]
    return _cases("invisible", rows)


def _references() -> list[Case]:
    rng = random.Random(1)
    references = [
        "9^{9^{9^{9}}}",
        "9" * BIG,
        "",
        " ",
        "\\boxed{",
        "\\boxed{}",
        "\\boxed{" * 10_000,
        "\\frac{" * DEEP,
        rng.randbytes(MB).decode("utf-8", "replace"),
        "\x00" * 1000,
        "4\u00b2",
        "(a+b+c+d+e+f)^{99}",
        "100000!",
        "10^{1000000}",
        "\\sqrt{" * DEEP + "2" + "}" * DEEP,
        "nan",
        "42" * MB,
        "\\exp(\\exp(99))",
        "2**2**2**2",
    ]
    return _cases(
        "reference",
        [("\\boxed{42}", reference, 0.0) for reference in references]
        + [
            ("\\boxed{42}", "\\boxed{42}", 1.0),
            ("\\boxed{42}", "\\fbox{42}", 1.0),
            ("\\boxed{42}", "\uff14\uff12", 1.0),
            ("\\boxed{42}", " 42 ", 1.0),
            ("\\boxed{42}", "x" * MB + "\\boxed{42}", 1.0),
            ("#### 42", "$42$", 1.0),
        ],
    )


def _costliest_admitted() -> list[Case]:
    """Pairs at the bounds that still reach math-verify: the slowest it is ever given (measured)."""
    return _cases(
        "admitted",
        _boxed(
            [
                ("(x+1)^{15}", "(1+x)^{15}", 1.0),
                ("(x+y)^{9}", "x^4+4x^3+6x^2+4x+1", 0.0),
                ("\\frac{x^2+y}{y+z}+\\frac{y+z^2}{z+x}", "1", 0.0),
                ("\\frac{x+1}{x+2}+\\frac{x+3}{x+4}", "y=2x+3", 0.0),
                ("y=x^2+2x+1", "y=2x+3", 0.0),
                ("x^4+3x-7=0", "x^4+3x-8=0", 0.0),
                ("x^2+y^2=25", "x^2+y=16", 0.0),
                ("\\{x+y,x-y,x^2\\}", "\\{x^2,x-y,x+y\\}", 1.0),
                ("(\\sqrt{2}+\\sqrt{3}+\\sqrt{5})^{4}", "\\frac{1}{2}", 0.0),
                ("\\sin(\\sin(1))", "\\frac{1}{2}", 0.0),
                ("\\frac{\\sqrt{2}+\\sqrt{3}}{\\sqrt{5}+\\sqrt{7}}", "\\sqrt{2}", 0.0),
                ("\\log_{3}(\\sin(1))", "2", 0.0),
                ("\\sin^{2}(\\frac{\\pi}{7})+\\cos^{2}(\\frac{\\pi}{7})", "1", 1.0),
                ("(1,2)\\cup(3,4)\\cup(5,6)", "(5,6)\\cup(3,4)\\cup(1,2)", 1.0),
                ("\\{1,2,3,4,5,6,7,8,9,10,11,12,13\\}", "\\{13,12,11,10,9,8,7,6,5,4,3,2,1\\}", 1.0),
                ("(999999999999999999999999999999^{9})^{9}", "999999999999999999999999999999^{81}", 1.0),
                ("99!+98!+97!", "99!+98!+97!+1", 0.0),
                ("x=400^{n+1}n\\cdot 3^{-\\frac{3}{2}}\\pm 654.6697", "x", 0.0),  # found by fuzzing
            ]
        ),
    )


HOSTILE = (
    _towers()
    + _huge_numbers()
    + _deep()
    + _past_joint_bounds()
    + _megabytes()
    + _garbage()
    + _unicode()
    + _invisible()
    + _references()
    + _costliest_admitted()
)


WARM_UP = [
    ("\\boxed{(x+1)^2}", "x^2+2x+1"),
    ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}"),
    ("\\boxed{[0,1)}", "\\{1,2\\}"),
    ("\\boxed{y=2x}", "\\frac{\\pi}{3}"),
]
# Paths whose first use in a process imports parts of sympy (once, up to ~1 s): taken before any timing.
FIRST_USE = WARM_UP + [
    ("\\boxed{\\sqrt{2+\\sqrt{3}}}", "\\frac{\\sqrt{6}+\\sqrt{2}}{2}"),
    ("\\boxed{x^2=4}", "x=2"),
    ("\\boxed{\\sin(\\pi/3)}", "\\frac{\\sqrt{3}}{2}"),
    ("\\boxed{\\log_2 8}", "3"),
    ("\\boxed{(1,2)\\cup(3,4)}", "x"),
    ("\\boxed{|x-1|}", "\\frac{1}{x}"),
    ("\\boxed{50\\%}", "0.5"),
]


def _cold() -> None:
    """Empty sympy's and math-verify's caches, so every timing is a first sight of its input, then score a
    few unrelated pairs: a long-running worker's sympy has its internals (assumptions, small numbers) warm."""
    sympy.core.cache.clear_cache()
    for name in dir(mv_parser):
        clear = getattr(getattr(mv_parser, name), "cache_clear", None)
        if clear is not None:
            clear()
    for response, reference in WARM_UP:
        math_reward(response, reference)


def _timed(response: object, reference: object) -> tuple[float, float]:
    _cold()
    start = time.perf_counter()
    score = math_reward(response, reference)
    return score, time.perf_counter() - start


def _in_thread(response: object, reference: object) -> tuple[float, float]:
    result: list[tuple[float, float]] = []
    worker = threading.Thread(target=lambda: result.append(_timed(response, reference)))
    worker.start()
    worker.join()
    return result[0]


@pytest.fixture(scope="module", autouse=True)
def _warm():
    for response, reference in FIRST_USE:  # math-verify's parser is built on first use, sympy imports lazily
        math_reward(response, reference)


def test_hostile_catalogue_covers_every_class():
    assert len({c.name for c in HOSTILE}) == len(HOSTILE)
    assert {c.kind for c in HOSTILE} == {
        "tower",
        "huge_number",
        "deep",
        "joint",
        "megabyte",
        "garbage",
        "unicode",
        "invisible",
        "reference",
        "admitted",
    }
    assert sum(c.expected == 1.0 for c in HOSTILE) >= 40


@pytest.mark.parametrize("case", HOSTILE, ids=[c.name for c in HOSTILE])
def test_hostile_case_in_the_main_thread(case):
    score, elapsed = _timed(case.response, case.truth)
    assert score == case.expected
    assert elapsed < BOUND_S, f"{case.name} took {elapsed:.3f} s"


@pytest.mark.slow  # the catalogue again off the main thread; the main thread: the test above
@pytest.mark.parametrize("case", HOSTILE, ids=[c.name for c in HOSTILE])
def test_hostile_case_in_a_worker_thread(case):
    score, elapsed = _in_thread(case.response, case.truth)
    assert score == case.expected
    assert elapsed < BOUND_S, f"{case.name} took {elapsed:.3f} s"


MEGABYTE_CASES = [c for c in HOSTILE if len(str(c.response)) + len(str(c.truth)) >= MB // 2]


@pytest.mark.parametrize("case", MEGABYTE_CASES, ids=[c.name for c in MEGABYTE_CASES])
def test_megabyte_input_allocates_a_bounded_amount(case):
    math_reward(case.response, case.truth)  # warm: caches are filled outside the measurement
    tracemalloc.start()
    try:
        math_reward(case.response, case.truth)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < PEAK_MIB * 2**20, f"{case.name} peaked at {peak / 2**20:.1f} MiB"
