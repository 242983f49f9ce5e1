"""GSM8K correctness reward: 1.0 when a response's final answer equals the reference, else 0.0.

The reward runs inside rollout workers (main thread, worker threads, Ray tasks, subprocesses), so it
is bounded by construction rather than by timeouts: only the last ``TAIL_CHARS`` characters are read,
every regex is linear on that tail, plain numbers are compared exactly with ``Fraction`` (no sympy),
and math-verify only ever sees a short whitelisted LaTeX string (no ``^``, shallow braces).

Unicode: only look-alikes that *are* the ASCII character in another width or font fold to it (full-width
``７２`` and mathematical bold ``𝟕𝟐`` read as ``72``). Other compatibility forms keep their meaning by
staying non-ASCII, so they never read as digits: superscripts (``4²`` is 16, not 42), subscripts, circled
numbers; digits of other scripts (Arabic-Indic ``٧٢``, Devanagari, ...) never match either. Invisible
format characters (zero-width space, bidi marks) are dropped, so they cannot split ``42`` into 4 and 2.
"""

from __future__ import annotations

import functools
import re
import signal
import threading
import unicodedata
from fractions import Fraction

from math_verify import parse, verify

TAIL_CHARS = 4096  # responses are judged on their end, where the final answer lives
_MAX_DIGITS = 40  # no GSM8K answer is longer; the cap keeps Fraction trivial
_MAX_BOXED = 256  # longest \boxed{...} body scanned for its closing brace
_MAX_LATEX = 64  # longest candidate ever handed to math-verify
_MAX_BRACE_DEPTH = 3  # \frac{\frac{1}{2}}{3} is depth 2; deeper is never a GSM8K answer
_MV_TIMEOUT_S = 1  # math-verify's SIGALRM timeout (integer seconds), where it can be used

# A decimal exponent of at most 2 digits keeps Fraction cheap; "1e999999999" is never read as "1".
_NUM = r"[-+]?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]{1,2}(?![0-9]))?"
_PLAIN = re.compile(_NUM)  # used with fullmatch only
# A number standing alone in prose: not glued to other digits or to a word before it ("mp3", "H2O" and a BPE
# sample's "shel5orm" hold no answer; "5 kg" and "5kg" do), not inside braces or brackets (an
# argument: "\\sqrt[2]{16}" is not 2), not an operand of ^ * / (so "9^{9^9}" or "2**2**2" never reduce
# to a harmless-looking "9" or "2"), not either half of an exponent too long to read ("1e999999999").
_LOOSE = re.compile(rf"(?<![0-9A-Za-z.,{{\[^*/])(?<![0-9][eE])(?<![0-9][eE][-+]){_NUM}"
                    rf"(?![0-9}}\]]|[.,][0-9]|[eE][-+]?[0-9]|\s*[\^*/])")
# Prose fallback: the last stand-alone number or simple integer fraction ("$\\frac{36}{2}$"), the fraction
# under the same rule (the innermost "\\frac{1}{2}" of a nested \\frac is an argument, not the answer).
_FRAC = r"-?\\[dt]?frac\{[0-9]{1,20}\}\{[0-9]{1,20}\}"
_LAST_VALUE = re.compile(rf"(?<![{{\[^*/]){_FRAC}(?![}}\]]|\s*[\^*/])|" + _LOOSE.pattern)
_ANSWER_IS = re.compile(r"answer is[ \t:]*([^\n]{1,80})", re.IGNORECASE)
_SAFE_LATEX = re.compile(r"(?:[0-9{}.,+\-/ ]|\\[dt]?frac|\\cdot)+")
# Markdown bold around an answer ("The answer is **42**."); never "2**2**2", whose stars touch operands.
_BOLD = re.compile(r"(?<![0-9A-Za-z)}\]])\*\*([^*\n]{1,200}?)\*\*(?![0-9A-Za-z({\[])")
# Compatibility forms that are the same character in another width or font; see the module docstring.
_FOLDED_FORMS = ("<wide>", "<font>", "<noBreak>")
# Delimiters and spacing that never change a value; "\$" must go before "$".
_DROP = ("\\$", "$", "\\%", "%", "\\!", "\\,")


def extract_gsm8k_answer(solution: str) -> str:
    """Reference answer of a GSM8K solution: text after the last ``####``, stripped, no commas.

    Raises ValueError when there is no ``####``: a malformed dataset row should fail loudly at load
    time instead of silently becoming an unreachable ground truth.
    """
    _, marker, answer = solution.rpartition("####")
    if not marker:
        raise ValueError(f"GSM8K solution has no '####' answer line: {solution[-200:]!r}")
    return answer.strip().replace(",", "")


def gsm8k_reward(response: str, ground_truth: str) -> float:
    """1.0 if the final answer in ``response`` numerically equals ``ground_truth``, else 0.0.

    Never raises (a reward must not take down a rollout worker) except for KeyboardInterrupt and
    SystemExit, which are how a task gets cancelled; non-str inputs score 0.0.
    """
    try:
        if not isinstance(response, str) or not isinstance(ground_truth, str):
            return 0.0
        candidate = _candidate(_normalise(response[-TAIL_CHARS:]))
        return 1.0 if _matches(candidate, _normalise(ground_truth[-TAIL_CHARS:])) else 0.0
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:
        return 0.0


def reward_input(text: object) -> str:
    """All of ``text`` that ``gsm8k_reward`` reads (its last ``TAIL_CHARS`` characters; "" for a
    non-string, which scores 0.0 like the original). Scoring processes are sent only this, so what
    they hold is bounded however long a response is."""
    return text[-TAIL_CHARS:] if isinstance(text, str) else ""


def _normalise(text: str) -> str:
    """Fold look-alike characters (see the module docstring), then unwrap markdown bold."""
    if not text.isascii():
        text = "".join(map(_fold, text))
    return _BOLD.sub(r"\1", text) if "**" in text else text


@functools.lru_cache(maxsize=8192)
def _fold(char: str) -> str:
    """One character's reading: its ASCII twin for width/font variants, nothing for invisible format
    characters, itself otherwise. U+2212 (minus) has no compatibility form, so it is mapped by hand."""
    if char == "\u2212":
        return "-"
    if unicodedata.category(char) == "Cf":
        return ""
    form = unicodedata.decomposition(char).partition(" ")[0]
    return unicodedata.normalize("NFKC", char) if form in _FOLDED_FORMS else char


def _candidate(text: str) -> str:
    """Final-answer text in priority order: last ``####`` line, last ``\\boxed{}``, "answer is",
    else the last stand-alone number or fraction. Priority matters: "#### 72\\nCheck: 5" must
    give 72, which math-verify alone does not do."""
    hashes = text.rfind("####")
    if hashes >= 0:
        return text[hashes + 4 :].strip().partition("\n")[0]
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed
    said = None
    for said in _ANSWER_IS.finditer(text):
        pass
    if said is not None:
        return said.group(1)
    values = _LAST_VALUE.findall(text)
    return values[-1] if values else ""


def _last_boxed(text: str) -> str | None:
    """Body of the last ``\\boxed{...}`` with balanced braces, or None when it does not close
    within ``_MAX_BOXED`` characters (so 10 000 unbalanced ``\\boxed{`` cost one short scan)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    body = start + len("\\boxed{")
    depth = 0
    for offset, char in enumerate(text[body : body + _MAX_BOXED]):
        if char == "{":
            depth += 1
        elif char == "}":
            if depth == 0:
                return text[body : body + offset]
            depth -= 1
    return None


def _matches(candidate: str, ground_truth: str) -> bool:
    """Exact Fraction comparison for plain numbers; math-verify only for small safe LaTeX; else
    the first stand-alone number of the candidate ("18 apples", "18 \\text{dollars}")."""
    cand, gt = _clean(candidate), _clean(ground_truth)
    cand_value, gt_value = _plain_value(cand), _plain_value(gt)
    if cand_value is not None and gt_value is not None:
        return cand_value == gt_value
    if _is_safe_latex(cand) and (gt_value is not None or _is_safe_latex(gt)):
        return _math_verify(cand, gt if gt_value is None else str(gt_value))
    loose = _LOOSE.search(cand)
    return loose is not None and gt_value is not None and _plain_value(loose.group()) == gt_value


def _clean(text: str) -> str:
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


def _math_verify(candidate: str, ground_truth: str) -> bool:
    """Symbolic comparison of two safe LaTeX strings, each wrapped in ``\\boxed{}``."""
    seconds = _timeout_seconds()
    gold = parse("\\boxed{" + ground_truth + "}", parsing_timeout=seconds)
    pred = parse("\\boxed{" + candidate + "}", parsing_timeout=seconds)
    return bool(gold and pred and verify(gold, pred, timeout_seconds=seconds))


def _timeout_seconds() -> int | None:
    """math-verify's timeout uses SIGALRM: it raises outside the main thread, and it would cancel an
    alarm the caller has pending (e.g. pytest-timeout). In those cases use None, which is safe
    because the input is already tiny and whitelisted; otherwise keep it as a second fence."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        return None
    return _MV_TIMEOUT_S
