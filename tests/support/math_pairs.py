"""A hand-written catalogue of MATH answer pairs for ``dtppo.rewards.verifiers.math.math_reward``.

Each row is ``(reference, answer, expected)``: ``reference`` is a bare MATH answer as in the dataset's
answer column, ``answer`` the final answer a response gives (the test embeds it in a response several
ways), and ``expected`` what a careful human grader gives it: 1.0 equal, 0.0 not.

Pairs where math-verify is known to grade differently from a careful human are left out, listed in
``DEVIATIONS`` with what math-verify says, so that no wrong grading is asserted as right:

- units inside ``\\text{}`` are dropped, whatever they are: ``5\\text{ cm}`` equals ``5\\text{ m}``;
- a percentage equals both its number and its fraction: ``25\\%`` equals ``25`` and ``0.25`` (a grader
  may accept one or the other depending on the question, never both);
- a decimal equals an irrational number when they agree to 6 places: ``\\sqrt{2}`` equals ``1.414214``;
- ``12.5\\%`` does not equal ``12.5`` though ``50\\%`` equals ``50`` (decimal percentages compare as
  fractions);
- trailing letters can read as a unit: ``6ab`` equals ``6``, not ``2a\\cdot 3b``;
- ``\\sin 30^\\circ`` is read as sin of 30 radians;
- a bare equation's right-hand side is its value: ``x^2+y^2=1`` "equals" ``1``;
- ``0.\\overline{3}``, ``\\binom{5}{2}`` and a pair of circle equations are outside the verifier's static
  bounds, so they score 0.0 unevaluated.
"""

from __future__ import annotations

EQUAL = 1.0
NOT_EQUAL = 0.0

INTEGERS = [
    ("42", "42", EQUAL),
    ("42", "42.0", EQUAL),
    ("42", "42.", EQUAL),  # a sentence's full stop
    ("0", "0", EQUAL),
    ("-7", "-7", EQUAL),
    ("-7", "- 7", EQUAL),
    ("1000", "1,000", EQUAL),
    ("1,000", "1000", EQUAL),
    ("1,\\!000", "1000", EQUAL),  # the dataset's thousands separator
    ("1000000", "1,000,000", EQUAL),
    ("3.5", "3.50", EQUAL),
    ("0.25", "0.250", EQUAL),
    ("2^{10}", "1024", EQUAL),
    ("1024", "2^{10}", EQUAL),
    ("10^{6}", "1000000", EQUAL),
    ("5!", "120", EQUAL),
    ("720", "6!", EQUAL),
    ("\\$18.90", "18.90", EQUAL),
    ("\\$18.90", "\\$18.9", EQUAL),
    ("12", "13", NOT_EQUAL),
    ("1000", "100", NOT_EQUAL),
    ("1,000", "1", NOT_EQUAL),
    ("3.5", "3.05", NOT_EQUAL),
    ("-7", "7", NOT_EQUAL),
    ("0.1", "0.01", NOT_EQUAL),
    ("2", "-2", NOT_EQUAL),
    ("2^{10}", "2^{11}", NOT_EQUAL),
    ("2^{10}", "20", NOT_EQUAL),
    ("5!", "24", NOT_EQUAL),
    ("\\$18.90", "19.80", NOT_EQUAL),
    ("100", "10^{3}", NOT_EQUAL),
]

FRACTIONS = [
    ("\\frac{1}{2}", "0.5", EQUAL),
    ("\\frac{1}{2}", "\\frac{2}{4}", EQUAL),
    ("\\frac{1}{2}", "1/2", EQUAL),
    ("0.5", "\\frac{1}{2}", EQUAL),
    ("\\frac{3}{4}", "0.75", EQUAL),
    ("\\frac{3}{4}", "\\frac34", EQUAL),
    ("\\dfrac{3}{4}", "\\frac{3}{4}", EQUAL),
    ("\\frac{5}{2}", "\\dfrac{5}{2}", EQUAL),
    ("\\dfrac{5}{2}", "2.5", EQUAL),
    ("\\tfrac{5}{8}", "0.625", EQUAL),
    ("\\frac{7}{2}", "\\frac{14}{4}", EQUAL),
    ("\\frac{7}{2}", "3\\frac{1}{2}", EQUAL),  # a mixed number
    ("\\frac{1}{3}", "\\frac{2}{6}", EQUAL),
    ("-\\frac{1}{2}", "\\frac{-1}{2}", EQUAL),
    ("-\\frac{1}{2}", "-0.5", EQUAL),
    ("-\\frac{3}{2}", "-1.5", EQUAL),
    ("\\frac{1}{2}", "\\frac{1}{3}", NOT_EQUAL),
    ("\\frac{2}{3}", "\\frac{3}{2}", NOT_EQUAL),
    ("\\frac{3}{4}", "0.7", NOT_EQUAL),
    ("0.5", "\\frac{1}{5}", NOT_EQUAL),
    ("\\frac{1}{3}", "0.33", NOT_EQUAL),  # a rounded decimal is not the fraction
    ("\\dfrac{5}{2}", "\\dfrac{2}{5}", NOT_EQUAL),
    ("-\\frac{1}{2}", "\\frac{1}{2}", NOT_EQUAL),
    ("\\frac{7}{2}", "7", NOT_EQUAL),
]

RADICALS = [
    ("2\\sqrt{2}", "\\sqrt{8}", EQUAL),
    ("3\\sqrt{2}", "\\sqrt{18}", EQUAL),
    ("\\sqrt{12}", "2\\sqrt{3}", EQUAL),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}", EQUAL),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", EQUAL),
    ("\\sqrt[3]{8}", "2", EQUAL),
    ("5+2\\sqrt{6}", "(\\sqrt{2}+\\sqrt{3})^2", EQUAL),
    ("\\frac{\\sqrt{6}+\\sqrt{2}}{4}", "\\frac{\\sqrt{2}+\\sqrt{6}}{4}", EQUAL),
    ("-\\sqrt{5}", "-\\sqrt{5}", EQUAL),
    ("2\\sqrt{2}", "2\\sqrt{3}", NOT_EQUAL),
    ("\\sqrt{8}", "8", NOT_EQUAL),
    ("3\\sqrt{2}", "\\sqrt{6}", NOT_EQUAL),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{2}}{2}", NOT_EQUAL),
    ("\\sqrt{2}", "2", NOT_EQUAL),
    ("-\\sqrt{5}", "\\sqrt{5}", NOT_EQUAL),
    ("\\sqrt[3]{8}", "\\sqrt{8}", NOT_EQUAL),
]

PI = [
    ("\\pi/4", "\\frac{\\pi}{4}", EQUAL),
    ("\\frac{\\pi}{4}", "\\pi/4", EQUAL),
    ("2\\pi", "2 \\pi", EQUAL),
    ("\\frac{3\\pi}{2}", "1.5\\pi", EQUAL),
    ("\\frac{4}{3}\\pi", "\\frac{4\\pi}{3}", EQUAL),
    ("36\\pi", "36 \\pi", EQUAL),
    ("\\pi", "\\pi", EQUAL),
    ("\\frac{\\pi}{4}", "\\frac{\\pi}{2}", NOT_EQUAL),
    ("2\\pi", "\\pi", NOT_EQUAL),
    ("\\pi", "3.14", NOT_EQUAL),  # an approximation
    ("36\\pi", "36", NOT_EQUAL),
    ("\\frac{4}{3}\\pi", "\\frac{3}{4}\\pi", NOT_EQUAL),
]

INTERVALS = [
    ("[0,1)", "[0,1)", EQUAL),
    ("[2,5]", "\\left[2,5\\right]", EQUAL),
    ("(-\\infty, 2]", "(-\\infty,2]", EQUAL),
    ("(1,\\infty)", "\\left(1, \\infty\\right)", EQUAL),
    ("[-1, \\frac{1}{2})", "[-1, 0.5)", EQUAL),
    ("(-\\infty, 2] \\cup (3, \\infty)", "(-\\infty,2]\\cup(3,\\infty)", EQUAL),
    ("(-\\infty, 2] \\cup (3, \\infty)", "(3,\\infty)\\cup(-\\infty,2]", EQUAL),
    ("(-\\infty,-4)\\cup(-4,6)\\cup(6,\\infty)", "(-\\infty, -4) \\cup (-4, 6) \\cup (6, \\infty)", EQUAL),
    ("[0,1)", "[0,1]", NOT_EQUAL),
    ("(0,1)", "[0,1]", NOT_EQUAL),
    ("[0,1]", "(0,1]", NOT_EQUAL),
    ("(-\\infty, 2]", "(-\\infty, 2)", NOT_EQUAL),
    ("(1,\\infty)", "(-1,\\infty)", NOT_EQUAL),
    ("(-\\infty, 2] \\cup (3, \\infty)", "(-\\infty,2)\\cup(3,\\infty)", NOT_EQUAL),
    ("(-\\infty, 2] \\cup (3, \\infty)", "(-\\infty,2]\\cup[3,\\infty)", NOT_EQUAL),
    ("(-\\infty,-4)\\cup(-4,6)\\cup(6,\\infty)", "(-\\infty,6)", NOT_EQUAL),
    ("[2,5]", "[2,6]", NOT_EQUAL),
]

SETS = [
    ("\\{1,2,3\\}", "\\{3,2,1\\}", EQUAL),
    ("\\{1,2\\}", "\\{2,1\\}", EQUAL),
    ("\\{1,2,3\\}", "\\{1,2,3\\}", EQUAL),
    ("1, 2, 3", "3, 2, 1", EQUAL),  # a list of all solutions is a set
    ("-2, 3", "3, -2", EQUAL),
    ("\\{\\frac{1}{2}, 2\\}", "\\{2, 0.5\\}", EQUAL),
    ("1\\pm\\sqrt{2}", "1+\\sqrt{2}, 1-\\sqrt{2}", EQUAL),
    ("\\pm 2", "2, -2", EQUAL),
    ("\\emptyset", "\\varnothing", EQUAL),
    ("\\{1,2\\}", "\\{1,2,3\\}", NOT_EQUAL),
    ("\\{1,2\\}", "\\{1,3\\}", NOT_EQUAL),
    ("-2, 3", "2, -3", NOT_EQUAL),
    ("1, 2, 3", "1, 2", NOT_EQUAL),
    ("\\pm 2", "2", NOT_EQUAL),
    ("1\\pm\\sqrt{2}", "1+\\sqrt{2}", NOT_EQUAL),
    ("\\{1,2,3\\}", "\\{1,2,4\\}", NOT_EQUAL),
]

TUPLES = [
    ("(1,2)", "(1,2)", EQUAL),
    ("(1,-2,3)", "(1,-2,3)", EQUAL),
    ("\\left(\\frac{1}{2}, 3\\right)", "(0.5,3)", EQUAL),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\pi/2)", EQUAL),
    ("(2,-1)", "\\left(2, -1\\right)", EQUAL),
    ("(1,2)", "(2,1)", NOT_EQUAL),
    ("(1,-2,3)", "(1,2,3)", NOT_EQUAL),
    ("(1,-2,3)", "(3,-2,1)", NOT_EQUAL),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\pi)", NOT_EQUAL),
    ("(2,-1)", "(-1,2)", NOT_EQUAL),
    ("(1,-2,3)", "(1,-2)", NOT_EQUAL),
]

DEGREES = [
    ("10^\\circ", "10", EQUAL),
    ("10^\\circ", "10^{\\circ}", EQUAL),
    ("45^\\circ", "45", EQUAL),
    ("45", "45^\\circ", EQUAL),
    ("120^\\circ", "120\\degree", EQUAL),
    ("45^\\circ", "135^\\circ", NOT_EQUAL),
    ("10^\\circ", "100", NOT_EQUAL),
    ("30^\\circ", "60^\\circ", NOT_EQUAL),
]

UNITS_AND_TEXT = [
    ("5\\text{ cm}", "5", EQUAL),
    ("5", "5\\text{ cm}", EQUAL),
    ("5\\text{ cm}", "5 \\text{cm}", EQUAL),
    ("12\\text{ inches}", "12", EQUAL),
    ("4\\text{ cm}^2", "4", EQUAL),
    ("\\text{Monday}", "\\text{Monday}", EQUAL),
    ("\\text{(C)}", "\\text{(C)}", EQUAL),
    ("\\text{odd}", "\\textbf{odd}", EQUAL),
    ("5\\text{ cm}", "6\\text{ cm}", NOT_EQUAL),
    ("12\\text{ inches}", "21", NOT_EQUAL),
    ("\\text{Monday}", "\\text{Tuesday}", NOT_EQUAL),
    ("\\text{(C)}", "\\text{(D)}", NOT_EQUAL),
    ("\\text{odd}", "\\text{even}", NOT_EQUAL),
]

PERCENT = [
    ("50\\%", "50\\%", EQUAL),
    ("50\\%", "50", EQUAL),
    ("50\\%", "25\\%", NOT_EQUAL),
    ("12.5\\%", "125", NOT_EQUAL),
]

EXPRESSIONS = [
    ("x^2+2x+1", "(x+1)^2", EQUAL),
    ("x^2-1", "(x-1)(x+1)", EQUAL),
    ("2x+3", "3+2x", EQUAL),
    ("3x^2-5x+2", "(3x-2)(x-1)", EQUAL),
    ("4x^2+4x+1", "(2x+1)^2", EQUAL),
    ("\\frac{1}{x+1}", "(x+1)^{-1}", EQUAL),
    ("\\frac{x}{2}", "0.5x", EQUAL),
    ("a+b", "b+a", EQUAL),
    ("x^3-x", "x(x-1)(x+1)", EQUAL),
    ("2x\\cdot 3y", "6xy", EQUAL),
    ("3+4i", "4i+3", EQUAL),
    ("\\frac{x+1}{x^2-1}", "\\frac{1}{x-1}", EQUAL),
    ("x^2+2x+1", "x^2+2x-1", NOT_EQUAL),
    ("x^2-1", "(x-1)^2", NOT_EQUAL),
    ("2x+3", "2x-3", NOT_EQUAL),
    ("x^3", "x^2", NOT_EQUAL),
    ("\\frac{x+1}{x-1}", "\\frac{x-1}{x+1}", NOT_EQUAL),
    ("6x", "6", NOT_EQUAL),
    ("3+4i", "3-4i", NOT_EQUAL),
    ("a+b", "a-b", NOT_EQUAL),
    ("x^3-x", "x(x-1)^2", NOT_EQUAL),
    ("4x^2+4x+1", "(4x+1)^2", NOT_EQUAL),
]

EQUATIONS = [
    ("3", "x=3", EQUAL),
    ("x=3", "3", EQUAL),
    ("x=3", "x = 3", EQUAL),
    ("y=2x+3", "y=3+2x", EQUAL),
    ("y = -\\frac{3}{4}x + 2", "y=-0.75x+2", EQUAL),
    ("x \\le 3", "x \\leq 3", EQUAL),
    ("y=x^2+1", "y=1+x^2", EQUAL),
    ("3", "x=4", NOT_EQUAL),
    ("x=2", "x=-2", NOT_EQUAL),
    ("y=2x+3", "y=2x-3", NOT_EQUAL),
    ("y = -\\frac{3}{4}x + 2", "y=\\frac{3}{4}x+2", NOT_EQUAL),
    ("x \\le 3", "x < 3", NOT_EQUAL),
    ("y=x^2+1", "y=x^2-1", NOT_EQUAL),
]

FUNCTIONS = [
    ("\\frac{\\sqrt{3}}{2}", "\\sin(\\pi/3)", EQUAL),
    ("\\frac{1}{2}", "\\cos(\\pi/3)", EQUAL),
    ("3", "\\log_2 8", EQUAL),
    ("\\frac{1}{2}", "\\sin(\\pi/3)", NOT_EQUAL),
    ("\\ln 2", "\\log 2", NOT_EQUAL),  # natural against common logarithm
    ("2", "\\log_2 8", NOT_EQUAL),
]

LATEX_NOISE = [
    ("\\frac{1}{2}", "\\displaystyle\\frac{1}{2}", EQUAL),
    ("\\frac{1}{2}", "\\left(\\frac{1}{2}\\right)", EQUAL),
    ("10", "1\\!0", EQUAL),
    ("2\\sqrt{3}", "2 \\, \\sqrt{3}", EQUAL),
    ("\\frac{1}{2}", "$\\frac{1}{2}$", EQUAL),
    ("8", "\\mathrm{8}", EQUAL),
    ("\\frac{1}{2}", "\\left(\\frac{1}{3}\\right)", NOT_EQUAL),
    ("8", "\\mathrm{9}", NOT_EQUAL),
]

PAIRS = (
    INTEGERS
    + FRACTIONS
    + RADICALS
    + PI
    + INTERVALS
    + SETS
    + TUPLES
    + DEGREES
    + UNITS_AND_TEXT
    + PERCENT
    + EXPRESSIONS
    + EQUATIONS
    + FUNCTIONS
    + LATEX_NOISE
)

# Where math-verify (as bounded here) grades differently from a careful human: (reference, answer,
# human grade, what math_reward gives). Asserted as math_reward's behaviour, not as correct grading.
DEVIATIONS = [
    ("5\\text{ cm}", "5\\text{ m}", NOT_EQUAL, EQUAL),
    ("25\\%", "0.25", None, EQUAL),  # depends on the question; math-verify accepts both readings
    ("\\sqrt{2}", "1.414214", NOT_EQUAL, EQUAL),
    ("12.5\\%", "12.5", EQUAL, NOT_EQUAL),  # yet 50% is 50: integers and decimals differ
    ("6", "6ab", NOT_EQUAL, EQUAL),  # the letters read as a unit
    ("2a\\cdot 3b", "6ab", EQUAL, NOT_EQUAL),
    ("\\frac{1}{2}", "\\sin 30^\\circ", EQUAL, NOT_EQUAL),
    ("1", "x^2+y^2=1", NOT_EQUAL, EQUAL),
    ("\\frac{1}{3}", "0.\\overline{3}", EQUAL, NOT_EQUAL),
    ("10", "\\binom{5}{2}", EQUAL, NOT_EQUAL),
    ("(x-1)^2+(y+2)^2=9", "(y+2)^2+(x-1)^2=9", EQUAL, NOT_EQUAL),  # past the bound on solving
]
