"""GSM8K correctness reward: 1.0 when a response's final answer equals the reference, else 0.0.

The reward runs inside rollout workers (main thread, worker threads, Ray tasks, subprocesses), so it
is bounded by construction rather than by timeouts: only the last ``answers.TAIL_CHARS`` are read,
every regex is linear on that tail, plain numbers are compared exactly with ``Fraction`` (no sympy),
and math-verify only ever sees a short whitelisted LaTeX string (no ``^``, shallow braces). Look-alike
characters are folded as ``dtppo.data.answers.normalise`` describes.
"""

from __future__ import annotations

import re
from fractions import Fraction

from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

from dtppo.data.answers import after_hashes, last_boxed, normalise, tail, verify_boxed

_MAX_DIGITS = 40  # no GSM8K answer is longer; the cap keeps Fraction trivial
_MAX_BOXED = 256  # longest box body scanned for its closing brace: a GSM8K answer is a short number
_MAX_LATEX = 64  # longest candidate ever handed to math-verify
_MAX_BRACE_DEPTH = 3  # \frac{\frac{1}{2}}{3} is depth 2; deeper is never a GSM8K answer
# math-verify's default configs; its expression reader is safe here because _SAFE_LATEX admits no "*" or "^".
_EXTRACTION = (LatexExtractionConfig(), ExprExtractionConfig())

# A decimal exponent of at most 2 digits keeps Fraction cheap; "1e999999999" is never read as "1".
_NUM = r"[-+]?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]{1,2}(?![0-9]))?"
_PLAIN = re.compile(_NUM)  # used with fullmatch only
# A number standing alone in prose: not glued to other digits or to a word before it ("mp3", "H2O" and a BPE
# sample's "shel5orm" hold no answer; "5 kg" and "5kg" do), not inside braces or brackets (an
# argument: "\\sqrt[2]{16}" is not 2), not an operand of ^ * / (so "9^{9^9}" or "2**2**2" never reduce
# to a harmless-looking "9" or "2"), not either half of an exponent too long to read ("1e999999999").
_LOOSE = re.compile(
    rf"(?<![0-9A-Za-z.,{{\[^*/])(?<![0-9][eE])(?<![0-9][eE][-+]){_NUM}"
    rf"(?![0-9}}\]]|[.,][0-9]|[eE][-+]?[0-9]|\s*[\^*/])"
)
# Prose fallback: the last stand-alone number or simple integer fraction ("$\\frac{36}{2}$"), the fraction
# under the same rule (the innermost "\\frac{1}{2}" of a nested \\frac is an argument, not the answer).
_FRAC = r"-?\\[dt]?frac\{[0-9]{1,20}\}\{[0-9]{1,20}\}"
_LAST_VALUE = re.compile(rf"(?<![{{\[^*/]){_FRAC}(?![}}\]]|\s*[\^*/])|" + _LOOSE.pattern)
_ANSWER_IS = re.compile(r"answer is[ \t:]*([^\n]{1,80})", re.IGNORECASE)
_SAFE_LATEX = re.compile(r"(?:[0-9{}.,+\-/ ]|\\[dt]?frac|\\cdot)+")
# Delimiters and spacing that never change a value; "\$" must go before "$".
_DROP = ("\\$", "$", "\\%", "%", "\\!", "\\,")


def gsm8k_reward(response: str, ground_truth: str) -> float:
    """1.0 if the final answer in ``response`` numerically equals ``ground_truth``, else 0.0.

    Never raises (a reward must not take down a rollout worker) except for KeyboardInterrupt and
    SystemExit, which are how a task gets cancelled; non-str inputs score 0.0.
    """
    try:
        if not isinstance(response, str) or not isinstance(ground_truth, str):
            return 0.0
        return 1.0 if _matches(_candidate(normalise(tail(response))), normalise(tail(ground_truth))) else 0.0
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:
        return 0.0


def _candidate(text: str) -> str:
    """Final-answer text in priority order: what follows the last ``####`` to the end of its line (blank lines
    skipped), the last ``\\boxed{}`` or ``\\fbox{}``, the last "answer is", else the last stand-alone number
    or fraction.
    Priority matters: "#### 72\\nCheck: 5" must give 72, which math-verify alone does not do."""
    hashes = after_hashes(text)
    if hashes is not None:
        return hashes.strip().partition("\n")[0]
    boxed = last_boxed(text, _MAX_BOXED)
    if boxed is not None:
        return boxed
    said = _ANSWER_IS.findall(text)
    if said:
        return said[-1]
    values = _LAST_VALUE.findall(text)
    return values[-1] if values else ""


def _matches(candidate: str, ground_truth: str) -> bool:
    """Exact Fraction comparison for plain numbers; math-verify only for small safe LaTeX; else
    the first stand-alone number of the candidate ("18 apples", "18 \\text{dollars}")."""
    cand, gt = _drop_delimiters(candidate), _drop_delimiters(ground_truth)
    cand_value, gt_value = _plain_value(cand), _plain_value(gt)
    if cand_value is not None and gt_value is not None:
        return cand_value == gt_value
    if _is_safe_latex(cand) and (gt_value is not None or _is_safe_latex(gt)):
        return verify_boxed(cand, gt if gt_value is None else str(gt_value), _EXTRACTION)
    loose = _LOOSE.search(cand)
    return loose is not None and gt_value is not None and _plain_value(loose.group()) == gt_value


def _drop_delimiters(text: str) -> str:
    """Drop math/currency delimiters and LaTeX spacing, then trailing sentence punctuation."""
    for token in _DROP:
        text = text.replace(token, "")
    return text.strip().rstrip(".").strip()


def _plain_value(text: str) -> Fraction | None:
    """Exact value of a plain number ("-1,000", "18.50", "4.2e1"); None otherwise or if > _MAX_DIGITS."""
    if not _PLAIN.fullmatch(text) or sum(c.isdigit() for c in text) > _MAX_DIGITS:
        return None
    return Fraction(text.replace(",", ""))


def _is_safe_latex(text: str) -> bool:
    """Short, whitelisted (no ``^``, no ``\\left``...), shallow, balanced LaTeX with a digit: the
    only input math-verify gets, which is why running it without a timeout cannot hang."""
    if not 0 < len(text) <= _MAX_LATEX or not _SAFE_LATEX.fullmatch(text):
        return False
    depth = deepest = 0
    for char in text:
        depth += (char == "{") - (char == "}")
        if depth < 0:
            return False
        deepest = max(deepest, depth)
    return depth == 0 and deepest <= _MAX_BRACE_DEPTH and any(c.isdigit() for c in text)
