"""MATH correctness reward: 1.0 when a response's final answer (its last ``\\boxed{...}``, else its ``####`` line)
equals the reference under math-verify, else 0.0.

Total and bounded by construction, since it runs where no timeout can interrupt sympy (worker threads, one long C
call): only the tails are read, and math-verify only sees answers inside the static bounds below; anything else scores
0.0 unevaluated. Why each bound and how it was measured: docs/design/verifiers.md.
"""

from __future__ import annotations

import itertools
import math
import re
import string
from typing import NamedTuple

from math_verify.parser import LatexExtractionConfig

from dtppo.data.answers import BOX_OPENERS, after_hashes, last_boxed, normalise, tail, verify_boxed

_MAX_ANSWER, _MAX_DIGITS, _MAX_FACTORIALS = 160, 30, 3  # characters; per digit run; n! per answer
_MAX_DEPTH = 5  # \left(\frac{\sqrt{3}}{2}, ...\right) is 3
_MAX_CARETS, _MAX_POWER = 4, 100
_MAX_ITEMS, _MAX_SET_OPS = 12, 3  # commas; \cup and \cap
_MAX_TERMS, _MAX_LIST_WEIGHT = 500, 24  # expansion terms; items + 4 * unions (a union against a long set)
_MAX_RELATION_DEGREE, _MAX_SYSTEM_DEGREE = 4, 6  # per side; summed over the pair, with 2+ variables
_MAX_VARS, _MAX_GENERATORS = 3, 6  # distinct letters; and radicals, \pi and function calls
_MAX_SYMBOLIC_DIGITS, _MAX_LOG_DIGITS = 40, 4  # with generators; with a logarithm (logcombine: log(3^n))
# Summed over the pair: size (no spaces, \left, \right), fractions, functions, items, |, set ops, \%.
_SYMBOLIC = (48, 2, 0, 4, 2, 0, 0)
_RADICAL = (80, 4, 2, 6, 2, 2, 0)

_LATEX_ONLY = [LatexExtractionConfig()]  # no ExprExtractionConfig: it would hand "2**2**2**2" to sympy
_CHARS = re.compile(r"[A-Za-z0-9 +\-*/=<>()\[\]{}.,;:!|^_\\%]*")
_COMMAND = re.compile(r"\\([A-Za-z]+|.)")
_FUNCTIONS = frozenset("sin cos tan cot sec csc arcsin arccos arctan log ln".split())
_GENERATORS = _FUNCTIONS | {"sqrt", "pi"}
_COMMANDS = _GENERATORS | frozenset(
    "text textbf textit mathrm mathbf frac dfrac tfrac infty cup cap left right cdot times div pm mp le ge "
    "leq geq ne neq lt gt circ in emptyset ldots cdots dots { } %".split()
)
_RELATION = re.compile(r"[=<>]|\\(?:le|ge|leq|geq|ne|neq|lt|gt|in)(?![A-Za-z])")
_TEXT_BODY = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf)\{[^{}\\]*\}")  # one opaque symbol
_ATOM = re.compile(r"\\[A-Za-z]+|[A-Za-z]")  # a command, else one variable letter (xy is x times y)
_LETTERS = frozenset(string.ascii_letters)
_DIGIT_RUN = re.compile(r"[0-9]+")
_FACTORIAL = re.compile(r"(?<![0-9.])([0-9]{1,2})!(?![!0-9])")
_ROOT_INDEX = re.compile(r"\\sqrt\[[0-9]\]")
_EXPONENT = re.compile(r"(?:[A-Za-z0-9+\-/.{}]|\\frac|\\pi)+")
# "1,\!000" is the dataset's 1000, so \! and \, before a digit glue; other spacing is a space.
_GLUE = re.compile(r"\\[,!](?=[0-9])|\\?\$")
_SPACING = re.compile(r"\\(?:quad|qquad|displaystyle)(?![A-Za-z])|\\[,;:! $]")
_REWRITES = (("\\mbox{", "\\text{"), ("\\degree", "^\\circ"), ("\\varnothing", "\\emptyset"))
# Unicode math symbols a model may write instead of LaTeX; any other non-ASCII fails the alphabet.
_SYMBOLS = str.maketrans(
    dict(
        zip(
            "\u03c0\u221e\u00b0\u2264\u2265\u2260\u222a\u2229\u00b7\u00d7\u00f7\u00b1",
            r"\pi |\infty |^\circ |\le |\ge |\ne |\cup |\cap |\cdot |\times |\div |\pm ".split("|"),
        )
    )
)


def math_reward(response: str, reference: str) -> float:
    """1.0 if the final answer of ``response`` equals ``reference`` (a bare MATH answer, or one wrapped in
    ``\\boxed{}``) mathematically, else 0.0. Never raises (a reward must not take down a rollout worker)
    but KeyboardInterrupt and SystemExit, which are how a task gets cancelled; non-str inputs score 0.0."""
    try:
        if not isinstance(response, str) or not isinstance(reference, str):
            return 0.0
        text = normalise(tail(response))
        answer = last_boxed(text)
        if answer is None:  # the GSM8K form: the rest of the last "####" line
            answer = (after_hashes(text) or "").partition("\n")[0]
        gold = normalise(tail(reference))
        gold = last_boxed(gold) if any(opener in gold for opener in BOX_OPENERS) else gold
        answer, gold = _canonical(answer), _canonical(gold or "")  # "" fails every bound
        answer_cost, gold_cost = _cost(answer), _cost(gold)
        if answer_cost is None or gold_cost is None or not _affordable(answer_cost, gold_cost):
            return 0.0
        return 1.0 if answer == gold or verify_boxed(answer, gold, _LATEX_ONLY) else 0.0
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:
        return 0.0


def _canonical(answer: str) -> str:
    """An answer as it is compared: unicode symbols spelled in LaTeX, spacing and ``$`` dropped, whitespace
    collapsed, a final period dropped."""
    answer = _SPACING.sub(" ", _GLUE.sub("", answer.translate(_SYMBOLS)))
    for old, new in _REWRITES:
        answer = answer.replace(old, new)
    return " ".join(answer.split()).rstrip(".").strip()


class _Cost(NamedTuple):
    """What one side costs sympy; ``_affordable`` adds two of them up."""

    letters: frozenset[str]  # variables: letters outside command names and \text{} bodies
    generators: int  # radical, \pi and function calls
    logs: int
    degree: int
    digits: int
    relation: bool
    caps: tuple[int, ...]  # what _SYMBOLIC / _RADICAL cap, in their order


def _cost(answer: str) -> _Cost | None:
    """The per-side bounds of the module docstring, then the counts for the joint ones; None when a
    per-side bound fails. Shape comes first: it bounds every later scan."""
    if not 0 < len(answer) <= _MAX_ANSWER or not _CHARS.fullmatch(answer) or "**" in answer:
        return None
    commands = _COMMAND.findall(answer)
    if not all(command in _COMMANDS for command in commands) or not _is_shallow(answer):
        return None
    if any(len(run) > _MAX_DIGITS for run in _DIGIT_RUN.findall(answer)):
        return None
    factorials = answer.count("!")
    if factorials > _MAX_FACTORIALS or len(_FACTORIAL.findall(answer)) != factorials:
        return None
    if answer.count("\\sqrt[") != len(_ROOT_INDEX.findall(answer)):
        return None  # a root index is one digit: \sqrt[99999]{2} is not an answer
    powers, relation = _exponents(answer), bool(_RELATION.search(answer))
    set_ops = commands.count("cup") + commands.count("cap")
    if powers is None or relation and powers[1] or answer.count(",") > _MAX_ITEMS or set_ops > _MAX_SET_OPS:
        return None  # (relation and an exponent with a variable: solving x=64^{n+1} for x and n took 0.5 s)
    exponents = powers[0]
    opaque = _TEXT_BODY.sub(lambda text: " " * len(text.group()), answer)
    size = len(answer.replace(" ", "")) - 5 * (commands.count("left") + commands.count("right"))
    caps = (
        size,
        sum(command in ("frac", "dfrac", "tfrac") for command in commands),
        sum(command in _FUNCTIONS for command in commands),
        answer.count(","),
        answer.count("|"),
        set_ops,
        answer.count("%"),
    )
    degree, digits = _degree_and_digits(opaque, exponents)
    logs = commands.count("log") + commands.count("ln")
    return _Cost(
        frozenset(_COMMAND.sub(" ", opaque)) & _LETTERS,
        sum(c in _GENERATORS for c in commands),
        logs,
        degree,
        digits,
        relation,
        caps,
    )


def _affordable(a: _Cost, b: _Cost) -> bool:
    """The joint bounds of the module docstring, on the pair sympy will work on."""
    letters = a.letters | b.letters
    generators = len(letters) + a.generators + b.generators
    terms = math.comb(a.degree + b.degree + generators, generators)
    solved = (a.relation or b.relation) and (
        max(a.degree, b.degree) > _MAX_RELATION_DEGREE or len(letters) > 1 and a.degree + b.degree > _MAX_SYSTEM_DEGREE
    )
    if terms > _MAX_TERMS or solved or a.caps[3] + b.caps[3] + 4 * (a.caps[5] + b.caps[5]) > _MAX_LIST_WEIGHT:
        return False
    if not generators:
        return True
    if a.digits + b.digits > (_MAX_LOG_DIGITS if a.logs or b.logs else _MAX_SYMBOLIC_DIGITS):
        return False
    used = map(int.__add__, a.caps, b.caps)
    return (
        len(letters) <= _MAX_VARS
        and generators <= _MAX_GENERATORS
        and all(map(int.__le__, used, _SYMBOLIC if letters else _RADICAL))
    )


def _is_shallow(answer: str) -> bool:
    """``{([`` against ``})]`` never below zero, closed at the end, at most ``_MAX_DEPTH`` deep. Counted
    together because intervals pair ``[`` with ``)``."""
    depths = list(itertools.accumulate((char in "{([") - (char in "})]") for char in answer))
    return all(0 <= depth <= _MAX_DEPTH for depth in depths) and depths[-1:] == [0]


def _exponents(answer: str) -> tuple[list[tuple[int, int]], bool] | None:
    """``(caret position, size)`` of every exponent (``_exponent``) and whether one has a variable; None if
    one is not allowed, there are more than ``_MAX_CARETS`` or their product exceeds ``_MAX_POWER``."""
    found = [(i, _exponent(answer[i + 1 :])) for i, char in enumerate(answer) if char == "^"]
    if len(found) > _MAX_CARETS or any(exponent is None for _, exponent in found):
        return None
    exponents = [(i, size) for i, (size, _) in found]
    symbolic = any(variable for _, (_, variable) in found)
    return (exponents, symbolic) if math.prod(max(size, 1) for _, size in exponents) <= _MAX_POWER else None


def _exponent(rest: str) -> tuple[int, bool] | None:
    """Size of the exponent at the start of ``rest`` (the text after a ``^``) and whether it has a variable.
    The size is its digit, 1 for a letter or ``\\pi``, 0 for ``\\circ``, the sum of a braced term's literals
    (which bounds any value they make: at most 12 characters of letters, short integers, ``+ - / .``,
    ``\\frac``, ``\\pi``); None when not allowed, also when another ``^`` follows (``9^9^9``: no chains)."""
    rest = rest.lstrip()
    if rest.startswith(("\\circ", "\\pi")):
        size, end, body = (1, 3, "") if rest.startswith("\\pi") else (0, 5, "")
    elif rest[:1].isdigit():
        size, end, body = None if rest[1:2].isdigit() else int(rest[0]), 1, ""
    elif rest[:1].isalpha():
        size, end, body = 1, 1, rest[0]
    else:
        end = (_group(rest, 0, 1) if rest.startswith("{") else None) or 0
        body = rest[1 : end - 1].replace(" ", "") if end else ""
        runs = _DIGIT_RUN.findall(body)
        size = (
            0
            if body == "\\circ"
            else None
            if len(body) > 12 or not _EXPONENT.fullmatch(body) or any(len(run) > 2 for run in runs)
            else sum(map(int, runs))
        )
    if size is None or rest[end:].lstrip().startswith("^"):
        return None
    return size, bool(set(_COMMAND.sub("", body)) & _LETTERS)


def _group(text: str, start: int, step: int) -> int | None:
    """Scanning from ``start`` by ``step`` (1 or -1) over a bracket group that opens there, the index
    just past its other end; None if ``text[start]`` does not open a group that closes."""
    opening, closing = ("{([", "})]") if step == 1 else ("})]", "{([")
    depth = 0
    for i in range(start, len(text) if step == 1 else -1, step):
        depth += (text[i] in opening) - (text[i] in closing)
        if depth <= 0:
            return i + step if depth == 0 and i != start else None
    return None


def _degree_and_digits(text: str, exponents: list[tuple[int, int]]) -> tuple[int, int]:
    """Upper bounds (``\\text{}`` bodies blanked) on the total degree of anything sympy can expand ``text``
    into, and on the digits of any integer it can compute: every atom (variable, radical, ``\\pi``,
    function) counts 1 and every digit run its length (``n!`` that of its value), times every exponent
    whose base holds it. A base not a letter, number, command or group (``|x|^9``) is all text before it."""
    atoms = {
        atom.start(): 1 for atom in _ATOM.finditer(text) if len(atom.group()) == 1 or atom.group()[1:] in _GENERATORS
    }
    digits = {run.start(): len(run.group()) for run in _DIGIT_RUN.finditer(text)}
    digits.update({n.start(): len(str(math.factorial(int(n.group(1))))) for n in _FACTORIAL.finditer(text)})
    for caret, size in exponents:
        base = _base(text, caret)
        for table in (atoms, digits):
            for position in table:
                if base <= position < caret:
                    table[position] *= max(size, 1)
    return sum(atoms.values()), sum(digits.values())


def _base(text: str, caret: int) -> int:
    """Where the base of the ``^`` at ``caret`` starts: a letter (or the command it ends), a number, or a
    chain of groups (``\\frac{a}{b}``, ``\\left(x\\right)``) with the command before it; else 0."""
    end = len(text[:caret].rstrip()) - 1
    if end < 0 or not (text[end].isalnum() or text[end] in ")}]"):
        return 0
    start = end
    while text[end].isdigit() and start > 0 and (text[start - 1].isdigit() or text[start - 1] == "."):
        start -= 1
    while text[start] in ")}]":  # a chain of groups: \frac{a}{b}, \left(x\right)
        start = _group(text, start, -1) + 1
        if start == 0 or text[start - 1] not in ")}]":
            break
        start -= 1
    letters = start
    while letters > 0 and text[letters - 1].isalpha():
        letters -= 1
    return letters - 1 if letters > 0 and text[letters - 1] == "\\" else start
