"""Sentences of docs/guides/performance*.md that sum up a record of bench/results say what the record holds: each test
recomputes the sentence's figures from the JSON and finds the sentence in the doc (its lines joined), and a changed
record changes the sentence, so a claim cannot outlive the figures it was made from."""

from __future__ import annotations

import json

from bench.common.paths import PERF
from tests.support.recipes import REPO

PASSES = {"critic": "critic", "policy": "policy", "logprobs": "log-prob recompute"}


def _doc(name: str) -> str:
    return " ".join((REPO / "docs" / "guides" / name).read_text().split())


def _rows(name: str, part: str = "rows") -> list[dict]:
    return json.loads((PERF / name).read_text())[part]


def _key(row: dict) -> tuple:
    return row["what"], row["layout"], row["cp"], row["T"]


def _span(values: list[float], digits: int = 2) -> str:
    return f"{min(values):.{digits}f}–{max(values):.{digits}f}"


def packed_against_padded(train: list[dict]) -> str:
    """performance.md, long responses: packed / padded at each (T, cp), peak memory and seconds, per pass."""
    padded = {_key(r): r for r in train if r["layout"] == "padded"}
    pairs = {
        what: [
            (r, padded[(what, "padded", r["cp"], r["T"])])
            for r in train
            if (r["what"], r["layout"]) == (what, "packed")
        ]
        for what in PASSES
    }
    (points,) = {len(p) for p in pairs.values()}
    memory = [f"{_span([a['peak_mib'] / b['peak_mib'] for a, b in pairs[w]])}× ({name})" for w, name in PASSES.items()]
    time = [f"{_span([a['seconds'] / b['seconds'] for a, b in pairs[w]])}×" for w in PASSES]
    return (
        f"Packed against padded, packed / padded at each T and cp ({points} points per pass in the JSON): "
        f"peak memory {', '.join(memory)}; time {', '.join(time)}."
    )


def kernels_memory_gap(avx2: list[dict], avx512: list[dict]) -> str:
    """performance.md, the AVX2 run: how far its peaks are below the AVX-512 run's with the same mmap threshold, at
    the points both measured."""
    same = {_key(r): r for r in avx512}
    common = [(r, same[_key(r)]) for r in avx2 if _key(r) in same]
    gaps = [b["peak_mib"] - a["peak_mib"] for a, b in common]
    side = "below" if min(gaps) > 0 else "apart from"  # "apart from" is not in the doc: the sentence must change
    lengths = sorted({a["T"] // 1024 for a, _ in common})
    return (
        f"The memory is {_span(gaps, 1)} MiB {side} the AVX-512 run's with the same threshold at "
        f"{lengths[0]}k–{lengths[-1]}k"
    )


def vocabulary_goal(rows: list[dict]) -> str:
    """performance-memory.md: the chunked head's vocabulary-sized extra against the full logits', goal <= 10 %."""
    measured = [r for r in rows if r["chunked_over_full"] is not None]  # None: the full logits added nothing
    worst = max(measured, key=lambda r: r["chunked_over_full"])
    held = len(measured) == len(rows) and worst["chunked_over_full"] <= 0.10
    return (
        f"holds {'in every row' if held else 'not in every row'}: at most {100 * worst['chunked_over_full']:.1f} % "
        f"({worst['chunked_vocab_extra_MiB']:,.0f} of {worst['full_vocab_extra_MiB']:,.0f} MiB"
    )


def offload_on_cpu(rows: list[dict]) -> str:
    """performance-memory.md: CPU offload on a CPU at dp=2, resident memory and the peaks against no feature."""
    at = {(r["role"], r["feature"]): r for r in rows if r["ranks"] == 2}
    roles = ("policy", "critic")
    resident = [
        f"{at[(o, 'cpu_offload')]['resident_MiB']:,.0f} vs {at[(o, 'off')]['resident_MiB']:,.0f} MiB" for o in roles
    ]

    def peaks(r: dict) -> tuple[float, ...]:  # each phase's peak over its start, and over the process's zero
        added = (r["fwd_bwd_peak_added_MiB"], r["optimizer_peak_added_MiB"])
        return *added, *(r["resident_MiB"] + a for a in added)

    gap = max(abs(a - b) for o in roles for a, b in zip(peaks(at[(o, "cpu_offload")]), peaks(at[(o, "off")])))
    within = "within ±150 MiB" if gap <= 150 else f"{gap:.0f} MiB apart"
    return (
        f"Resident memory is {resident[0]} for the policy and {resident[1]} for the critic; "
        f"the peaks are the same {within}"
    )


def _find(row_list: list[dict], **match) -> dict:
    return next(r for r in row_list if all(r[k] == v for k, v in match.items()))


def test_long_responses_packed_against_padded():
    train = _rows("long_responses.json", "train")
    assert packed_against_padded(train) in _doc("performance.md")
    _find(train, what="logprobs", layout="packed", cp=1, T=16384)["peak_mib"] *= 1.2  # negative control
    assert packed_against_padded(train) not in _doc("performance.md")


def test_long_responses_memory_on_both_kernel_sets():
    avx2, avx512 = _rows("long_responses_avx2.json", "train"), _rows("long_responses_mmap.json", "train")
    assert kernels_memory_gap(avx2, avx512) in _doc("performance.md")
    _find(avx2, cp=2, T=8192)["peak_mib"] += 3.0  # negative control: now above the AVX-512 run's
    assert kernels_memory_gap(avx2, avx512) not in _doc("performance.md")


def test_the_vocabulary_goal_holds_in_every_row():
    rows = _rows("memory_vocab.json")
    assert vocabulary_goal(rows) in _doc("performance-memory.md")
    _find(rows, ranks=2, phase="train")["chunked_over_full"] = 0.12  # negative control: one row over the goal
    assert vocabulary_goal(rows) not in _doc("performance-memory.md")


def test_cpu_offload_on_a_cpu_keeps_the_peaks():
    rows = _rows("memory_features.json")
    assert offload_on_cpu(rows) in _doc("performance-memory.md")
    _find(rows, ranks=2, role="critic", feature="cpu_offload")["fwd_bwd_peak_added_MiB"] += 200  # negative control
    assert offload_on_cpu(rows) not in _doc("performance-memory.md")
