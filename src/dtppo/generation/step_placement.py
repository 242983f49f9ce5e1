"""Step rewards onto tokens: a reward function gives a response's steps as ``(end, reward)`` pairs, ``end`` a
character offset in the decoded response, and each reward goes on the token holding character ``end − 1``.

Where a token's text ends is found without decoding it in context: every vocabulary entry is decoded alone once per
tokenizer, and the tokens' ends are the running sum of their pieces' lengths, checked against the decoded texts (a
row whose pieces do not make its text is measured exactly, by decoding its prefixes). That measurement needs no
scores, so the reward phase runs it while the scoring processes work (``StepPlacer.prepare``)."""

from __future__ import annotations

import weakref
from itertools import accumulate

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from dtppo.generation.responses import ResponseTokens


class StepPlacer:
    """Puts one batch's step rewards on its tokens: ``tokens``, the tokens ``texts`` were decoded from
    (``decode_tokens``). ``prepare`` measures where each token's text ends; ``place`` runs it first when it has not
    run, then maps each step to its token."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, tokens: ResponseTokens, texts: list[str]):
        self.tokenizer, self.tokens, self.texts = tokenizer, tokens, texts
        self.starts = [0, *accumulate(map(len, texts))]  # [B + 1]: each row's text's offset in the texts joined
        self._ends: tuple[np.ndarray, np.ndarray] | None = None

    def prepare(self) -> None:
        """Measure the tokens' ends (once): the part of placing that needs no scores."""
        if self._ends is None:
            kept = np.flatnonzero(self.tokens.keep)  # [K]: b * T + t of each decoded token, row after row
            flat = self.tokens.ids.take(kept)
            self._ends = kept, char_ends(self.tokenizer, flat, self.tokens.keep.sum(1), self.texts, self.starts)

    def place(self, steps: list[tuple[tuple[int, float], ...]]) -> torch.Tensor:
        """Each row's ``steps`` on the token holding character ``end − 1`` of its text -> [2, B, T] float32: the
        rewards (summed where steps share a token) and the mask of the tokens that hold a step."""
        batch, width = self.tokens.keep.shape
        placed = np.zeros((2, batch * width), dtype=np.float32)
        targets = [start + end for start, row in zip(self.starts, steps) for end, _ in row]  # [S], in the texts joined
        if targets:
            self.prepare()
            kept, ends = self._ends
            # ends[j] closes decoded token j − 1; a step's end − 1 lies in the first token whose end reaches its end
            token = kept[np.searchsorted(ends, targets) - 1]  # [S]: b * T + t
            placed[0] = np.bincount(token, [reward for row in steps for _, reward in row], batch * width)
            placed[1, token] = 1.0
        return torch.from_numpy(placed.reshape(2, batch, width))


def char_ends(
    tokenizer: PreTrainedTokenizerBase, flat: np.ndarray, counts: np.ndarray, texts: list[str], starts: list[int]
) -> np.ndarray:
    """Where each decoded token's text ends in the rows' texts joined: flat: [K] int64, the decoded tokens' ids, row
    after row; counts: [B], how many of them each row has; texts: each row's ``decode(ids, skip_special_tokens=True)``;
    starts: [B + 1], the running sum of the texts' lengths from 0 -> [K + 1] int64: 0, then the running sum of the
    tokens' lengths (a dropped special token adds 0).

    In NumPy, whose calls cost a few microseconds where a small tensor op costs ten or more: this runs once per step.
    """
    pieces, lengths = _vocabulary_pieces(tokenizer)
    sizes = lengths.take(flat)  # [K]
    bounds = counts.cumsum()  # [B]: where each row's tokens end in flat
    ends = np.zeros(len(flat) + 1, dtype=np.int64)
    sizes.cumsum(out=ends[1:])
    # Every row's pieces make its text when the rows' lengths agree and so do all texts joined: one check
    if ends.take(bounds).tolist() == starts[1:] and "".join(pieces.take(flat).tolist()) == "".join(texts):
        return ends
    for stop, count, text in zip(bounds.tolist(), counts.tolist(), texts):
        row = flat[stop - count : stop].tolist()
        if "".join(pieces[row].tolist()) != text:
            prefixes = tokenizer.batch_decode([row[: k + 1] for k in range(count)], skip_special_tokens=True)
            exact = np.maximum.accumulate([len(p) for p in prefixes])
            sizes[stop - count : stop] = np.diff(exact, prepend=0)
    sizes.cumsum(out=ends[1:])
    return ends


_PIECES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _vocabulary_pieces(tokenizer: PreTrainedTokenizerBase) -> tuple[np.ndarray, np.ndarray]:
    """([vocabulary] object, each token id's text decoded alone, special tokens as ""; [vocabulary] int64, their
    lengths), once per tokenizer. An object array: a batch's pieces are gathered by one indexing, not a loop."""
    if tokenizer not in _PIECES:
        ids = [[i] for i in range(len(tokenizer))]
        backend = getattr(tokenizer, "backend_tokenizer", None)  # one call into the Rust tokenizer when there is one
        decode = backend.decode_batch if backend is not None else tokenizer.batch_decode
        pieces = np.empty(len(ids), dtype=object)
        pieces[:] = decode(ids, skip_special_tokens=True)
        _PIECES[tokenizer] = pieces, np.array([len(p) for p in pieces], dtype=np.int64)
    return _PIECES[tokenizer]
