"""Sequence packing: right-padded rows ``[B, T]`` -> fewer packed rows ``[R, L]`` of whole sequences.

Why: a right-padded batch spends forward and backward work on pad tokens, and RL batches have a wide
length spread (a few truncated responses set ``T`` for everyone). Packing lays several sequences back to
back in one row. Three things keep each packed sequence exactly what it was alone:

- ``position_ids`` restart at 0 for every sequence, so rotary embeddings see the unpacked positions;
- ``attention_mask`` is block-diagonal causal (``[R, 1, L, L]`` bool), so a token attends only to earlier
  tokens of its own sequence. HF models take such a 4-D mask as given (transformers >= 4.5x);
- ``sequence_starts`` marks each sequence's first token: anything read one position back (log-probs from
  the logits at t-1, V(s_t) from the value head at t-1) restarts there (see :func:`dtppo.ops.shift_right`).

Rows hold at most ``capacity`` tokens (default: the batch's padded width ``T``), so a packed row costs the
same attention work as a padded one; only the number of rows shrinks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedRows:
    """A packed batch and the map back to the padded layout it came from.

    input_ids:       [R, L] int64, whole sequences back to back; filler id 0 after the last one
    position_ids:    [R, L] int64, 0, 1, ... within each sequence (the filler counts on from 0 as well)
    attention_mask:  [R, 1, L, L] bool, True where query i may attend key j: same sequence and j <= i
    sequence_starts: [R, L] bool, True at the first token of each sequence
    source:          [R, L] int64, flat index ``b * T + t`` of the padded position a packed token came
                     from; -1 on the filler
    padded_shape:    (B, T) of the padded batch
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    sequence_starts: torch.Tensor
    source: torch.Tensor
    padded_shape: tuple[int, int]

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """Per-token values of the padded layout in the packed one. x: [B, T] -> [R, L], 0 on the filler."""
        picked = x.reshape(-1)[self.source.clamp(min=0)]
        return torch.where(self.source >= 0, picked, torch.zeros_like(picked))

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """Per-token results back to the padded layout. x: [R, L, ...] -> [B, T, ...], 0 on padding.

        Differentiable (an index_put into zeros), so losses computed on the padded layout train the packed
        forward; filler outputs are dropped and receive no gradient.
        """
        batch, width = self.padded_shape
        valid = self.source >= 0
        out = x.new_zeros(batch * width, *x.shape[2:])
        return out.index_put((self.source[valid],), x[valid]).reshape(batch, width, *x.shape[2:])


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Bin packing: longest sequence first, each into the first row with room. Returns row -> indices.

    Deterministic (ties keep batch order); at most 11/9·OPT + 6/9 rows (Dósa 2007).
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        slot = next((r for r, free in enumerate(room) if free >= lengths[i]), None)
        if slot is None:
            bins.append([])
            room.append(capacity)
            slot = len(bins) - 1
        bins[slot].append(i)
        room[slot] -= lengths[i]
    return bins


def sequence_lengths(attention_mask: torch.Tensor) -> torch.Tensor:
    """Tokens per right-padded row. attention_mask: [B, T] -> [B] int64.

    Raises ValueError if a row is not ``[ones | zeros]``: packing moves the first ``len`` tokens of a row,
    so a hole inside a row would be silently dropped.
    """
    lengths = attention_mask.long().sum(-1)
    expected = torch.arange(attention_mask.shape[1], device=attention_mask.device)[None] < lengths[:, None]
    if not torch.equal(expected, attention_mask.bool()):
        raise ValueError("sequence packing needs right-padded rows ([tokens | pad]) in attention_mask")
    return lengths


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, capacity: int | None = None) -> PackedRows:
    """Pack the sequences of a right-padded batch. input_ids, attention_mask: [B, T] -> PackedRows.

    capacity: most tokens per packed row (default ``T``; at least the longest sequence).
    """
    batch, width = input_ids.shape
    lengths = sequence_lengths(attention_mask).tolist()
    capacity = max(capacity or width, max(lengths, default=1), 1)
    bins = first_fit_decreasing(lengths, capacity)
    packed_width = max((sum(lengths[i] for i in row) for row in bins), default=1) or 1
    source = torch.full((len(bins), packed_width), -1, dtype=torch.long)
    position = torch.zeros(len(bins), packed_width, dtype=torch.long)
    segment = torch.zeros(len(bins), packed_width, dtype=torch.long)  # 0 = filler, k = k-th sequence of the row
    for r, row in enumerate(bins):
        offset = 0
        for k, i in enumerate(row, start=1):
            n = lengths[i]
            source[r, offset : offset + n] = i * width + torch.arange(n)
            position[r, offset : offset + n] = torch.arange(n)
            segment[r, offset : offset + n] = k
            offset += n
        position[r, offset:] = torch.arange(packed_width - offset)  # the filler is its own causal block
    device = input_ids.device
    source, position, segment = source.to(device), position.to(device), segment.to(device)
    ids = torch.where(source >= 0, input_ids.reshape(-1)[source.clamp(min=0)], 0)
    return PackedRows(
        input_ids=ids,
        position_ids=position,
        attention_mask=block_causal_mask(segment),
        sequence_starts=(position == 0) & (source >= 0),
        source=source,
        padded_shape=(batch, width),
    )


def block_causal_mask(segment: torch.Tensor) -> torch.Tensor:
    """Causal attention within equal segment ids. segment: [R, L] int64 -> [R, 1, L, L] bool (True = attend).

    Every query keeps at least itself, so no softmax row is empty (an empty row would give NaN).
    """
    width = segment.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=segment.device).tril()
    same = segment[:, :, None] == segment[:, None, :]
    return (same & causal).unsqueeze(1)
