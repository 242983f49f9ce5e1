"""Arithmetic-step verifier: every worked step ``a op b = c`` of a completion, found and checked exactly.

``find_steps`` lists the steps in order of where they start; ``step_rewards`` turns them into ``(offset, reward)``
pairs for a dense, per-step reward. Pure Python: values are ``Fraction``s (``0.1+0.2=0.3`` is correct, ``10/3=3.33``
is not), never floats, and nothing here imports torch.

What is read:

- GSM8K's calculator annotations ``<<48/2=24>>``: the annotation body is the step (its span is the body, without the
  brackets). The text around it is masked first, so ``48/2 = <<48/2=24>>24`` is one step, and neither the prose
  before it nor the result text after ``>>`` is a second one. A body may open with a sign (``<<+30+46=76>>``).
- Prose steps, ``3 + 4 = 7``, ``12 x $2 = $24``, ``(20+30)/2=25``; tiny_math's worked lines ``5 - 3 = 2`` and
  ``a+k=b<=t`` / ``a+k=b>t``, where the comparison after the result is part of the step (it is checked too, against
  the result as written, and the step's span includes it). Comparisons: ``<= >= < > ≤ ≥ ≠``.
- Operators ``+ - * / × ÷ x`` with the usual precedence (``*`` before ``+``) and parentheses, left to right within a
  level: a chain ``a+b+c=d`` or ``2+3*4=14`` is one step, whose left side is evaluated in full. A step needs one
  operator at least (``<<15=15>>`` is not a step).
- Numbers: integers and decimals (``.5``), thousands separators (``1,000``, as the GSM8K reader takes them), an
  optional ``$`` before a number, and a minus glued to a number where it cannot be an operator: at a step's start
  after a non-operand (``x = -3 + 5 = 2``), after an operator (``5 * -3 = -15``) and as the result (``= -2``).
- Look-alikes as the answer reader reads them: every character is folded with ``dtppo.data.answers``'s own
  folding (full-width ``３＋４＝７``, U+2212 minus, mathematical bold digits; invisible format characters dropped,
  so ``7<ZWSP>12`` is 712) and markdown bold is unwrapped (``= **7**``), so the text a step is read from is exactly
  ``answers.normalise(text)``; offsets still point into the original text. A result's digits run on as far as the
  reader's numbers do: ``3+4=712`` reads 712 (wrong), ``3+4=7apples`` reads 7 (as ``5kg`` reads 5), and digits
  glued to a word before them are no number (``mp3+4=7`` is not a step).

What is deliberately not read (no step, so neither reward nor penalty): a right side that is itself an expression
(``2*3+4 = 6+4 = 10`` checks only ``6+4=10``: ``2*3+4=6`` is an unfinished chain, not an error), a mixed number
(``= 1 1/2``) or an algebra term (``= 5A/5``); any operand or result followed by ``%``, ``^`` or an exponent
(``7e1``); a step preceded by an operator (the tail of ``2^3+1=9`` or ``2**3+1=9``), or a fraction after a number
(``8 x 1 1/2 = 12`` is not ``1/2 = 12``); an ``x`` before a signed operand (``3x-5=16`` is algebra); integers with a
leading zero (clock times: ``0900-0130 = 0730``); floor division ``//``, powers, ``≈``, ``==``, units between
operands (``5 kg + 3 kg``); a number glued to ``,``/``.`` and a digit that is not a thousands group (``7,5``); more
than ``_MAX_OPERANDS`` operands, ``_MAX_DIGITS`` digits in a number or ``_MAX_DEPTH`` nested parentheses (bounds that
keep every check cheap). Division by zero is a wrong step. A change of unit inside a step is wrong by its arithmetic
(GSM8K's own ``$1 / 2 = 50 cents``). Reading is linear in the text's length: each start is tried once, each try is
bounded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

# Private names of the answer reader, imported on purpose: a step must read its numbers exactly as a final answer
# is read (answers.normalise is _fold per character, then _BOLD), and offsets need that folding one character at a
# time, which normalise itself does not expose.
from dtppo.data.answers import _BOLD, _fold

_MAX_DIGITS = 40  # per number, as the GSM8K reader's cap: no worked step needs more, and Fraction stays trivial
_MAX_OPERANDS = 64  # per step: the longest GSM8K annotation chain has 6
_MAX_DEPTH = 4  # nested parentheses: GSM8K annotations nest 2 deep at most

_SPACE = " \t"
# A number: optional glued minus and "$", then digits with optional thousands groups and decimals. It ends where the
# GSM8K reader's stand-alone numbers end: not before a digit, "%", ",5"/".5" or an exponent ("7e1").
_NUMBER = re.compile(
    r"(-?)\$?(?!0[0-9])((?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+)(?![0-9%]|[.,][0-9]|[eE][-+]?[0-9])"
)
_ADD = re.compile(r"[ \t]*([-+])[ \t]*")
_MUL = re.compile(r"[ \t]*([*/×÷x])[ \t]*")
_OPEN = re.compile(r"(-?)\([ \t]*")
_CLOSE = re.compile(r"[ \t]*\)")
_EQUALS = re.compile(r"[ \t]*=[ \t]*")
_COMPARE = re.compile(r"[ \t]*(<=|>=|≤|≥|≠|<|>)[ \t]*")
# What makes a result not a plain number: an operator and an operand after it ("= 7 + 1"), a power, the fraction
# of a mixed number ("= 1 1/2"), or letters that make it a term ("= 5A/5", "= 1.2Y / 1.2": algebra).
_MORE = re.compile(
    r"[ \t]*(?:[-+*/×÷x][ \t]*(?:-?\$?(?:[0-9]|\.[0-9])|-?\()|\^)|[ \t]+[0-9]+/[0-9]|[A-Za-z]+[ \t]*[-+*/×÷^]"
)
_ANNOTATION = re.compile(r"<<([^<>\n]*)>>")
# Where a prose step may start: a number, a sign or a parenthesis not glued to a word or number before it.
_START = re.compile(r"(?<![0-9A-Za-z_.,$])(?:[-$(0-9]|\.(?=[0-9]))")
_OPERATORS = frozenset("+-*/×÷^")
_FRACTION = re.compile(r"[0-9]+[ \t]*/[ \t]*[0-9]")
_COMPARISONS = {
    "<=": Fraction.__le__,
    ">=": Fraction.__ge__,
    "≤": Fraction.__le__,
    "≥": Fraction.__ge__,
    "≠": Fraction.__ne__,
    "<": Fraction.__lt__,
    ">": Fraction.__gt__,
}


@dataclass(frozen=True)
class Step:
    """One arithmetic step: ``text[start:end]`` is where it was read (``end`` just after its last character:
    the result, or the comparison's number), ``expression`` the normalised text checked (``3+4=7`` for
    ``３+４=７``), ``correct`` whether its arithmetic (and its comparison, if it has one) holds exactly."""

    start: int
    end: int
    expression: str
    correct: bool


def find_steps(text: str) -> list[Step]:
    """Every arithmetic step of ``text`` (see the module docstring for the forms), ordered by ``start``.
    A non-string has no steps."""
    if not isinstance(text, str) or not text:
        return []
    normal, origin = _normalised(text)
    found: list[tuple[int, int, bool]] = []
    masked = list(normal)
    for match in _ANNOTATION.finditer(normal):
        step = _annotation_step(normal, match.start(1), match.end(1))
        if step is not None:
            found.append(step)
        # Masked with a character no rule reads, so "48/2 = <<...>>24" cannot become the prose step "48/2 = 24".
        masked[match.start() : match.end()] = "\0" * (match.end() - match.start())
    found += _prose_steps("".join(masked))
    found.sort()
    return [Step(origin[i], origin[j - 1] + 1, normal[i:j], correct) for i, j, correct in found]


def step_rewards(
    text: str, mode: Literal["per_step", "first_error"], reward: float = 1.0, penalty: float = -1.0
) -> list[tuple[int, float]]:
    """``(character offset, reward)`` pairs for the steps of ``text``, each at its step's ``end``.

    ``per_step``: ``reward / n`` for each correct step, n the number of steps found (right and wrong), nothing for
    a wrong one; so an all-correct chain sums to ``reward`` and a text with no steps gets ``[]``. ``first_error``:
    one ``(end, penalty)`` at the first wrong step and nothing else (``[]`` when every step is right). Offsets may
    repeat (a caller mapping them to tokens adds up what lands on one token)."""
    steps = find_steps(text)
    if mode == "per_step":
        return [(step.end, reward / len(steps)) for step in steps if step.correct]
    if mode == "first_error":
        wrong = next((step for step in steps if not step.correct), None)
        return [] if wrong is None else [(wrong.end, penalty)]
    raise ValueError(f"step_rewards mode must be 'per_step' or 'first_error', not {mode!r}")


def _normalised(text: str) -> tuple[str, list[int] | range]:
    """``answers.normalise(text)`` and, for each of its characters, the index of the character of ``text`` it
    was read from (folding drops invisible characters, and unwrapping bold drops the stars)."""
    if text.isascii() and "**" not in text:
        return text, range(len(text))
    chars: list[str] = []
    origin: list[int] = []
    for index, char in enumerate(text):
        for folded in char if char.isascii() else _fold(char):
            chars.append(folded)
            origin.append(index)
    folded_text = "".join(chars)
    if "**" not in folded_text:
        return folded_text, origin
    dropped = set()
    for match in _BOLD.finditer(folded_text):
        dropped.update((match.start(), match.start() + 1, match.end() - 2, match.end() - 1))
    keep = [i for i in range(len(chars)) if i not in dropped]
    return "".join(chars[i] for i in keep), [origin[i] for i in keep]


def _annotation_step(text: str, start: int, end: int) -> tuple[int, int, bool] | None:
    """The step that is a whole annotation body ``text[start:end]``, or None if the body is not one step."""
    body = text[start:end]  # read on its own, so no step runs past the body
    lead = len(body) - len(body.lstrip(_SPACE))
    first = lead + body.startswith("+", lead)  # a leading "+" is a sign in the calculator's syntax
    step = _step_at(body, first)
    if step is None or body[step[0] :].strip(_SPACE):
        return None
    return start + lead, start + step[0], step[1]


def _prose_steps(text: str) -> list[tuple[int, int, bool]]:
    """The steps outside annotations, left to right, none overlapping another."""
    found: list[tuple[int, int, bool]] = []
    resume = 0
    for match in _START.finditer(text):
        start = match.start()
        if start < resume or not _may_start(text, start):
            continue
        step = _step_at(text, start)
        if step is not None:
            found.append((start, step[0], step[1]))
            resume = step[0]
    return found


def _may_start(text: str, start: int) -> bool:
    """Whether a step may start at ``start``: not inside a larger expression (after an operator, a closing
    bracket, or an operator ``x``), and a leading minus only where it cannot be a binary minus."""
    before = start
    while before > 0 and text[before - 1] in _SPACE:
        before -= 1
    if before == 0:
        return True
    previous = text[before - 1]
    if previous in _OPERATORS or previous in ")]}":
        return False
    if previous.isdigit() and _FRACTION.match(text, start):
        return False  # the fraction of a mixed number: "8 x 1 1/2 = 12" is not "1/2 = 12"
    if previous == "x" and (before < 2 or not text[before - 2].isalpha()):
        return False  # "2 x 3+4=7" read from 3 on would drop the "2 x"; "box 3+4=7" is a step
    # "5 -3+4=6" read from the minus would drop the 5; after a word ("apples -3") the sign is still ambiguous.
    return text[start] != "-" or not (previous.isalnum() or previous in ".%")


def _step_at(text: str, start: int) -> tuple[int, bool] | None:
    """``(end, correct)`` of the step ``expression = number [comparison number]`` at ``start``, or None."""
    reader = _Reader(text)
    left = reader.sum(start, 0)
    if left is None or reader.operators == 0:
        return None
    equals = _EQUALS.match(text, left[0])
    result = equals and _number(text, equals.end())
    if not result or _MORE.match(text, result[0]):
        return None
    end, written = result
    correct = left[1] is not None and left[1] == written
    compare = _COMPARE.match(text, end)
    bound = compare and _number(text, compare.end())
    if bound and not _MORE.match(text, bound[0]):
        end, correct = bound[0], correct and _COMPARISONS[compare.group(1)](written, bound[1])
    return end, correct


def _number(text: str, start: int) -> tuple[int, Fraction] | None:
    """``(end, value)`` of the number at ``start`` (``_NUMBER``), or None; None too past ``_MAX_DIGITS``."""
    match = _NUMBER.match(text, start)
    if match is None or sum(char.isdigit() for char in match.group(2)) > _MAX_DIGITS:
        return None
    value = Fraction(match.group(2).replace(",", ""))
    return match.end(), -value if match.group(1) else value


class _Reader:
    """A recursive-descent reader of one left side: ``sum := product ((+|-) product)*``, ``product := operand
    ((*|/|x|×|÷) operand)*``, ``operand := number | -?( sum )``. Each method returns ``(end, value)`` or None
    when nothing is read at that position; ``value`` is None when it is undefined (a division by zero). An
    operator with no operand after it ends the expression before that operator."""

    def __init__(self, text: str) -> None:
        self.text, self.operands, self.operators = text, 0, 0

    def sum(self, start: int, depth: int) -> tuple[int, Fraction | None] | None:
        return self._chain(start, depth, _ADD, self.product)

    def product(self, start: int, depth: int) -> tuple[int, Fraction | None] | None:
        return self._chain(start, depth, _MUL, self.operand)

    def _chain(self, start, depth, operator, term) -> tuple[int, Fraction | None] | None:
        """``term (operator term)*``, folded left to right."""
        got = term(start, depth)
        if got is None:
            return None
        end, value = got
        while match := operator.match(self.text, end):
            # "3x-5=16" is algebra, so an "x" takes no signed operand ("5 x -3" is not read either)
            signed = match.group(1) == "x" and self.text.startswith("-", match.end())
            right = None if signed else term(match.end(), depth)
            if right is None:
                break
            end, value = right[0], _apply(match.group(1), value, right[1])
            self.operators += 1
        return end, value

    def operand(self, start: int, depth: int) -> tuple[int, Fraction | None] | None:
        self.operands += 1
        if self.operands > _MAX_OPERANDS:
            return None
        number = _number(self.text, start)
        if number is not None:
            return number
        opening = _OPEN.match(self.text, start)
        if opening is None or depth >= _MAX_DEPTH:
            return None
        inner = self.sum(opening.end(), depth + 1)
        closing = inner and _CLOSE.match(self.text, inner[0])
        if not closing:
            return None
        value = inner[1]
        return closing.end(), -value if opening.group(1) and value is not None else value


def _apply(operator: str, left: Fraction | None, right: Fraction | None) -> Fraction | None:
    """``left operator right`` exactly; None when either side is undefined or it divides by zero."""
    if left is None or right is None:
        return None
    if operator == "+":
        return left + right
    if operator == "-":
        return left - right
    if operator in "*×x":
        return left * right
    return None if right == 0 else left / right
