"""Reading final answers out of text: the tail a verifier reads, look-alike folding, the last ``\\boxed{}`` or
``\\fbox{}``, the ``####`` answer marker, and math-verify's comparison of two answers.

Shared by the built-in verifiers (``dtppo.rewards.verifiers``) and the data layer, which reads reference answers
with the same rules (``dtppo.data.formats``). It imports nothing from dtppo, so either side loads it alone (scoring
processes included). Every scan here is bounded by construction, whatever the text: a verifier reads only the
last ``TAIL_CHARS`` characters, and a box's closing brace is looked for within ``max_body`` characters.

Unicode (``normalise``): only look-alikes that *are* the ASCII character in another width or font fold to it
(full-width ``７２`` and mathematical bold ``𝟕𝟐`` read as ``72``). Other compatibility forms keep their meaning by
staying non-ASCII, so they never read as digits: superscripts (``4²`` is 16, not 42), subscripts, circled
numbers; digits of other scripts (Arabic-Indic ``٧٢``, Devanagari, ...) never match either. Invisible format
characters (zero-width space, bidi marks) are dropped, so they cannot split ``42`` into 4 and 2.
"""

from __future__ import annotations

import functools
import re
import signal
import threading
import unicodedata
from collections.abc import Sequence

from math_verify import parse, verify

TAIL_CHARS = 4096  # responses are judged on their end, where the final answer lives
BOX_BODY_CHARS = 512  # box bodies of MATH answers with \text{} units and \left( run longer than the answers
BOX_OPENERS = ("\\boxed{", "\\fbox{")
_MV_TIMEOUT_S = 1  # math-verify's SIGALRM timeout (integer seconds), where it can be used
# Markdown bold around an answer ("The answer is **42**."); never "2**2**2", whose stars touch operands.
_BOLD = re.compile(r"(?<![0-9A-Za-z)}\]])\*\*([^*\n]{1,200}?)\*\*(?![0-9A-Za-z({\[])")
# Compatibility forms that are the same character in another width or font; see the module docstring.
_FOLDED_FORMS = ("<wide>", "<font>", "<noBreak>")


def tail(text: object) -> str:
    """The part of ``text`` a verifier reads: its last ``TAIL_CHARS`` characters ("" for a non-string). Scoring
    processes are sent only this, so what they hold is bounded however long a response is."""
    return text[-TAIL_CHARS:] if isinstance(text, str) else ""


def normalise(text: str) -> str:
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


def last_boxed(text: str, max_body: int = BOX_BODY_CHARS) -> str | None:
    """Body of the last ``\\boxed{...}`` or ``\\fbox{...}`` in ``text``; None if there is none or its braces do
    not balance within ``max_body`` characters (so 10 000 unbalanced ``\\boxed{`` cost one short scan). An
    earlier, balanced box is not used: the final answer is the last one."""
    start, opener = max((text.rfind(opener), opener) for opener in BOX_OPENERS)
    if start < 0:
        return None
    body = start + len(opener)
    depth = 0
    for offset, char in enumerate(text[body : body + max_body]):
        depth += (char == "{") - (char == "}")
        if depth < 0:
            return text[body : body + offset]
    return None


def after_hashes(text: str) -> str | None:
    """Everything after the last ``####`` (GSM8K's answer marker), or None when there is none."""
    _, marker, rest = text.rpartition("####")
    return rest if marker else None


def extract_gsm8k_answer(solution: str) -> str:
    """Reference answer of a GSM8K solution: text after the last ``####``, stripped, no commas.

    Raises ValueError when there is no ``####``: a malformed dataset row should fail loudly at load
    time instead of silently becoming an unreachable ground truth.
    """
    answer = after_hashes(solution)
    if answer is None:
        raise ValueError(f"GSM8K solution has no '####' answer line: {solution[-200:]!r}")
    return answer.strip().replace(",", "")


def verify_boxed(answer: str, gold: str, extraction: Sequence) -> bool:
    """math-verify's comparison of two answers the caller has bounded, each wrapped in ``\\boxed{}`` and read
    with the ``extraction`` configs; gold first (the comparison is not symmetric: ``x=3`` as an answer to ``3``
    counts, by its right-hand side)."""
    seconds = _timeout_seconds()
    parsed_gold = parse("\\boxed{" + gold + "}", extraction, parsing_timeout=seconds)
    parsed = parse("\\boxed{" + answer + "}", extraction, parsing_timeout=seconds)
    return bool(parsed_gold and parsed and verify(parsed_gold, parsed, timeout_seconds=seconds))


def _timeout_seconds() -> int | None:
    """math-verify's timeout uses SIGALRM: it raises outside the main thread, and it would cancel an
    alarm the caller has pending (e.g. pytest-timeout). In those cases use None, which is safe only
    because callers hand it bounded input; otherwise keep it as a second fence."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        return None
    return _MV_TIMEOUT_S
