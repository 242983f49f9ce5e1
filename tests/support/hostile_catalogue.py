"""A catalogue of hostile completions for the GSM8K reward, each with the score the contract gives it.

The contract (docs/guides/rewards.md, dtppo.rewards.verifiers.gsm8k): 1.0 iff the response's *final answer* equals the
ground truth numerically, else 0.0; never raises; bounded time. The rules that decide the expected scores below:

- the final answer is, in priority order: the last ``####`` line, the last ``\\boxed{}`` (or ``\\fbox{}``), the
  last "answer is ...", else the last stand-alone number (or simple ``\\frac``) of the text;
- only the last ``TAIL_CHARS`` (4096) characters are read: an answer buried under more text is not seen;
- plain numbers compare exactly ("42.0", "4.2e1" with a 1-2 digit exponent, "1,000", "$42", "42%" all
  mean their number; "%" is dropped, not converted); short ``\\frac`` / ``/`` / ``\\cdot`` LaTeX goes to
  math-verify; anything else (``^``, ``**``, ``\\sqrt``, deep nesting, > 40 digits) is never evaluated;
- a number that is an operand of ``^ * /`` or sits inside braces is not "stand-alone";
- Unicode: full-width and mathematical-font digits are digits; superscripts, subscripts, circled and
  other-script digits are not; invisible format characters (zero-width space, bidi marks) are dropped.

Built programmatically and deterministically (seeded); ``catalogue()`` is cached per process.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

MB = 1_000_000
BIG = 100_000  # digits in a "huge integer"
DEEP = 500  # nesting depth of the deep LaTeX cases


@dataclass(frozen=True)
class Case:
    kind: str  # the case class, one row of docs/guides/reliability.md
    name: str  # unique id
    response: object
    truth: object
    expected: float

    def __repr__(self) -> str:  # megabyte strings must not flood a failure report
        return f"Case({self.name!r}, expected={self.expected})"


def _cases(kind: str, rows: list[tuple[object, object, float]]) -> list[Case]:
    return [Case(kind, f"{kind}-{i:03d}", r, t, e) for i, (r, t, e) in enumerate(rows)]


def _right_and_wrong(rows: list[tuple[str, str, str]]) -> list[tuple[object, object, float]]:
    """Each (response, right truth, wrong truth) gives two cases: 1.0 and 0.0."""
    return [(r, right, 1.0) for r, right, _ in rows] + [(r, wrong, 0.0) for r, _, wrong in rows]


def answer_formats() -> list[Case]:
    rows = [
        ("\\boxed{42}", "42", "43"),
        ("So the total is \\boxed{42}.", "42", "4"),
        ("#### 42", "42", "43"),
        ("####42", "42", "4"),
        ("Work: 6 * 7 = 42\n#### 42\n", "42", "7"),
        ("The answer is 42", "42", "43"),
        ("The answer is 42.", "42", "43"),
        ("The final answer is: $42$", "42", "43"),
        ("THE ANSWER IS 42", "42", "43"),
        ("42", "42", "43"),
        ("42.0", "42", "42.1"),
        ("#### 42.00", "42", "43"),
        ("4.2e1", "42", "4.2"),
        ("#### 4.2e1", "42", "4.2"),
        ("\\boxed{4.2E+1}", "42", "4.2"),
        ("#### 420e-1", "42", "420"),
        ("$42$", "42", "43"),
        ("#### \\$42", "42", "43"),
        ("#### $42.00", "42", "43"),
        ("The answer is **42**.", "42", "43"),
        ("**The answer is 42**", "42", "43"),
        ("**Answer:** 42", "42", "43"),
        ("#### 42%", "42", "0.42"),
        ("The answer is 42\\%", "42", "0.42"),
        ("\\boxed{\\frac{84}{2}}", "42", "84"),
        ("$\\dfrac{84}{2}$", "42", "2"),
        ("#### 84/2", "42", "84"),
        ("\\boxed{6 \\cdot 7}", "42", "6"),
        ("\\boxed{42 \\text{ apples}}", "42", "43"),
        ("She has 6 bags of 7, so 42 apples", "42", "7"),
        ("((42))", "42", "43"),
        ("#### 41\n#### 42", "42", "41"),
        ("\\boxed{41} was a slip. #### 42", "42", "41"),
        ("#### 42\nCheck: 41 + 1 = 42, and 41 is odd", "42", "41"),
        ("#### 1,000", "1000", "1"),
        ("#### 1000", "1,000", "100"),
        ("The answer is 1,000,000.", "1000000", "1000"),
        ("The answer is 1\\,000.", "1000", "1"),
        ("#### 1,234.5", "1234.5", "1234"),
        ("#### -42", "-42", "42"),
        ("\\boxed{-42}", "-42", "42"),
        ("The temperature fell to \u221242 degrees", "-42", "42"),
        ("#### - 42", "-42", "42"),
        ("$-42$", "-42", "42"),
        ("#### -4.2e1", "-42", "42"),
        ("\\boxed{\\frac{1}{2}}", "0.5", "2"),
        ("#### 1/2", "0.5", "2"),
        ("#### 0.50", "0.5", "50"),
        ("#### 5e-1", "0.5", "5"),
        ("#### 0", "0", "1"),
    ]
    never = [  # answer-like text that is not the ground truth under the contract
        ("#### 4200%", "42"),
        ("#### 0.42", "42"),
        ("#### 42.5", "42"),
        ("#### 4.2e2", "42"),
        ("\\boxed{\\sqrt{1764}}", "42"),
        ("#### 2^{2^2}", "16"),
        ("#### 6*7", "42"),
        ("#### 6**2", "36"),
        ("#### 1.000", "1000"),
        ("#### 1 000", "1000"),
        ("#### 1,00", "100"),
        ("I don't know", "42"),
        ("", "42"),
        ("#### ", "42"),
        ("\\boxed{}", "42"),
        ("The answer is", "42"),
        ("#### 42e", "4200"),
        ("#### 1e999999999", "1"),
        ("#### 1e100", "1"),
        ("#### 1e100", "100"),
        ("#### 2e-999", "999"),
        ("The answer is 41**.", "42"),
    ]
    return _cases("format", _right_and_wrong(rows) + [(r, t, 0.0) for r, t in never])


def power_towers() -> list[Case]:
    rows = [("9^9^9^9", "9", 0.0), ("9^{9^{9^{9}}}", "9", 0.0), ("#### 9^9^9^9", "9", 0.0)]
    for base in ("2", "3", "9"):
        for height in (2, 3, 5):
            caret = "^".join([base] * height)
            braced = base + "".join("^{" + base for _ in range(height - 1)) + "}" * (height - 1)
            python = "**".join([base] * height)
            for tower in (caret, braced, python):
                for template in ("{}", "#### {}", "\\boxed{{{}}}", "The answer is {}."):
                    rows.append((template.format(tower), base, 0.0))
    return _cases("power_tower", rows)


def huge_integers() -> list[Case]:
    big = "9" * BIG
    rows = [
        (big, "9", 0.0),
        ("#### " + big, "9", 0.0),
        ("#### " + big, "9999", 0.0),
        ("#### " + big, big, 0.0),
        ("\\boxed{" + big + "}", "9", 0.0),
        ("The answer is " + big, "9", 0.0),
        ("-" + big, "-9", 0.0),
        ("1" + "0" * BIG, "1", 0.0),
        ("0." + "3" * BIG, "0.333", 0.0),
        ("#### 1e" + big, "1", 0.0),
        ("#### " + ",".join(["999"] * (BIG // 3)), "999", 0.0),
        ("#### 42\n" + big, "42", 0.0),
        (big + "\n#### 42", "42", 1.0),
        (big + " so the answer is 42.", "42", 1.0),
        ("\\boxed{" + big + "} no: \\boxed{42}", "42", 1.0),
    ]
    return _cases("huge_integer", rows)


def deep_latex() -> list[Case]:
    frac = "\\frac{" * DEEP + "1}{2}" * DEEP
    sqrt = "\\sqrt{" * DEEP + "16" + "}" * DEEP
    rows = [(frac, t, 0.0) for t in ("1", "2", "0.5")]
    rows += [("\\boxed{" + frac + "}", "0.5", 0.0), ("#### " + frac, "0.5", 0.0)]
    rows += [(sqrt, t, 0.0) for t in ("16", "4", "2")] + [("\\boxed{" + sqrt + "}", "2", 0.0)]
    rows += [
        ("\\sqrt[" * DEEP + "2]{16}" * DEEP, "2", 0.0),
        ("x^{" * DEEP + "2" + "}" * DEEP, "2", 0.0),
        ("{" * DEEP + "42" + "}" * DEEP, "42", 0.0),
        ("\\frac{" * 10_000, "1", 0.0),
        ("\\boxed{" * 10_000, "42", 0.0),
        ("}" * 10_000 + "42", "42", 1.0),
        ("\\left(" * DEEP + "42" + "\\right)" * DEEP, "42", 1.0),
        ("\\boxed{" * DEEP + "42" + "}" * DEEP, "42", 1.0),  # boxing 42 again is still 42
        ("\\boxed{" * DEEP + "41" + "}" * DEEP, "42", 0.0),
        (frac + "\n#### 42", "42", 1.0),
        (sqrt + " The answer is 42.", "42", 1.0),
    ]
    return _cases("deep_latex", rows)


def binary_garbage() -> list[Case]:
    rng = random.Random(0)
    rows = []
    for size in (1_000, 64_000, MB):
        raw = rng.randbytes(size)
        for codec, errors in (
            ("utf-8", "replace"),
            ("latin-1", "strict"),
            ("utf-8", "surrogateescape"),
            ("utf-16", "replace"),
        ):
            text = raw.decode(codec, errors)
            rows += [(text, "987654321", 0.0), (text + "\n#### 42", "42", 1.0)]
    rows += [
        ("\x00" * MB, "0", 0.0),
        ("#### 4\x002\x00", "42", 0.0),
        ("\x1b[31m#### 42\x1b[0m", "42", 1.0),
        ("".join(map(chr, range(32))) * 1000, "1", 0.0),
    ]
    return _cases("binary_garbage", rows)


def megabyte_strings() -> list[Case]:
    fills = [
        "a",
        " ",
        "\n",
        "#",
        "$",
        "{",
        "}",
        "\\",
        "-",
        ".",
        ",",
        "^",
        "*",
        "%",
        "1,",
        "1.",
        "1e",
        "1 ",
        "####",
        "\\boxed{",
        "answer is ",
        "\\frac{1}{2}",
        "**4",
        "\U0001f600",
        "\u200b",
        "\uff14",
        "9^",
    ]
    rows = [((fill * (MB // len(fill) + 1))[:MB], "42", 0.0) for fill in fills]
    rows += [((fill * (MB // len(fill) + 1))[:MB] + "\nThe answer is 42.", "42", 1.0) for fill in fills[:8]]
    return _cases("megabyte", rows)


def unicode_lookalikes() -> list[Case]:
    def digits(zero: int, text: str = "42") -> str:
        return "".join(chr(zero + int(d)) for d in text)

    folded = [0xFF10, 0x1D7CE, 0x1D7D8, 0x1D7E2, 0x1D7EC, 0x1D7F6]  # full-width; math bold/double/sans/mono
    other = [0x0660, 0x06F0, 0x0966, 0x09E6, 0x0E50, 0x0F20, 0x07C0, 0x1040]  # Arabic-Indic ... Myanmar
    rows = [("#### " + digits(z), "42", 1.0) for z in folded]
    rows += [("\\boxed{" + digits(z) + "}", "42", 1.0) for z in folded[:2]]
    rows += [("#### " + digits(z), "42", 0.0) for z in other]
    rows += [("The answer is " + digits(z) + ".", "42", 0.0) for z in other]
    rows += [
        ("\uff03\uff03\uff03\uff03 \uff14\uff12", "42", 1.0),  # full-width "#### 42"
        ("#### \uff0d\uff14\uff12", "-42", 1.0),  # full-width minus
        ("#### 4\uff12", "42", 1.0),
        ("The answer is\u00a042.", "42", 1.0),  # no-break space
        ("#### \uff11/\uff12", "0.5", 1.0),
        ("#### \u2074\u00b2", "42", 0.0),
        ("#### 4\u00b2", "42", 0.0),
        ("#### 4\u00b2", "16", 0.0),
        ("#### \u2084\u2082", "42", 0.0),
        ("The answer is 4\u2082", "42", 0.0),
        ("#### \u2463\u2461", "42", 0.0),
        ("#### \u32b7", "42", 0.0),
        ("#### \u2477\u2475", "42", 0.0),
        ("#### \u278d\u278b", "42", 0.0),
        ("#### \u216b", "12", 0.0),
        ("#### \u00bd", "0.5", 0.0),
        ("#### 4\u041e", "40", 0.0),  # Cyrillic O is not zero
        ("#### 1\u00a0000", "1000", 0.0),
    ]
    return _cases("unicode", rows)


def invisible_characters() -> list[Case]:
    rows = []
    for mark in ("\u200b", "\u200c", "\u200d", "\u2060", "\u00ad", "\ufeff", "\u202e", "\u2066"):
        rows += [
            ("#### 4" + mark + "2", "42", 1.0),
            ("#### 4" + mark + "2", "4", 0.0),
            ("#### 4" + mark + "2", "2", 0.0),
        ]
    rows += [("\ufeff#### 42", "42", 1.0), ("The answer is \u202e24", "24", 1.0), ("The answer is \u202e24", "42", 0.0)]
    return _cases("invisible", rows)


def hostile_truths() -> list[Case]:
    rng = random.Random(1)
    truths = [
        "9^9^9^9",
        "9" * BIG,
        "",
        "####",
        "\\frac{" * DEEP,
        rng.randbytes(MB).decode("utf-8", "replace"),
        "\x00" * 1000,
        "4\u00b2",
        "\u0664\u0662",
        "nan",
        "inf",
        "1e999999999",
        "42 apples",
        "forty-two",
    ]
    rows = [("#### 42", t, 0.0) for t in truths] + [("#### 42", "\uff14\uff12", 1.0), ("#### 42", " 42 ", 1.0)]
    return _cases("hostile_truth", rows)


def non_strings() -> list[Case]:
    rows = [
        (None, "42", 0.0),
        (42, "42", 0.0),
        (b"#### 42", "42", 0.0),
        (["#### 42"], "42", 0.0),
        ("#### 42", None, 0.0),
        ("#### 42", 42, 0.0),
        (42.0, 42.0, 0.0),
    ]
    return _cases("non_string", rows)


@functools.cache
def catalogue() -> tuple[Case, ...]:
    cases = (
        answer_formats()
        + power_towers()
        + huge_integers()
        + deep_latex()
        + binary_garbage()
        + megabyte_strings()
        + unicode_lookalikes()
        + invisible_characters()
        + hostile_truths()
        + non_strings()
    )
    assert len({c.name for c in cases}) == len(cases)
    return tuple(cases)
