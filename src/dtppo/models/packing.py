"""Sequence packing: right-padded rows ``[B, T]`` -> fewer packed rows ``[R, L]`` of whole sequences, and back.

Invariant: a packed sequence computes exactly what it computes alone. ``position_ids`` restart per sequence,
attention follows the rows' :class:`~dtppo.models.attention.Segments` (no dense mask), and ``sequence_starts`` stops
every one-position shift at a sequence boundary. :func:`check_packing` refuses packing for a model where packed and
padded differ. Why, and what a block-causal mask would break: docs/design/sequences.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dtppo.errors import InputError
from dtppo.models.attention import Segments


@dataclass(frozen=True)
class PackedRows:
    """A packed batch and the map back to the padded layout it came from.

    input_ids:       [R, L] int64, whole sequences back to back; filler id 0 after the last one
    position_ids:    [R, L] int64, 0, 1, ... within each sequence (the filler counts on from 0 as well): the
                     rotary positions, and the boundaries for a model on transformers' ``sdpa``
    sequence_starts: [R, L] bool, True at the first token of each sequence
    source:          [R, L] int64, flat index ``b * T + t`` of the padded position a packed token came
                     from; -1 on the filler
    padded_shape:    (B, T) of the padded batch
    segments:        the sequences (and each row's filler) for ``models.attention``'s kernel
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    sequence_starts: torch.Tensor
    source: torch.Tensor
    padded_shape: tuple[int, int]
    segments: Segments

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


def needed_mask(attention_mask: torch.Tensor) -> torch.Tensor | None:
    """The padding mask a causal forward of these rows needs: none for right-padded rows ([tokens | pad]), whose
    tokens never attend to the padding after them, so attention runs without a dense mask (``models.attention``);
    ``attention_mask`` [B, T] itself for any other layout (left padding, holes)."""
    lengths = attention_mask.long().sum(-1)
    expected = torch.arange(attention_mask.shape[1], device=attention_mask.device)[None] < lengths[:, None]
    return None if torch.equal(expected, attention_mask.bool()) else attention_mask


def sequence_lengths(attention_mask: torch.Tensor) -> torch.Tensor:
    """Tokens per right-padded row. attention_mask: [B, T] -> [B] int64.

    Raises ValueError if a row is not ``[ones | zeros]``: packing moves the first ``len`` tokens of a row,
    so a hole inside a row would be silently dropped.
    """
    if needed_mask(attention_mask) is not None:
        raise ValueError("sequence packing needs right-padded rows ([tokens | pad]) in attention_mask")
    return attention_mask.long().sum(-1)


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
    spans = []
    for r, row in enumerate(bins):
        offset = 0
        for i in row:
            n = lengths[i]
            source[r, offset : offset + n] = i * width + torch.arange(n)
            position[r, offset : offset + n] = torch.arange(n)
            spans.append((r * packed_width + offset, r * packed_width + offset + n))
            offset += n
        position[r, offset:] = torch.arange(packed_width - offset)  # the filler is a sequence of its own
        if offset < packed_width:
            spans.append((r * packed_width + offset, (r + 1) * packed_width))
    device = input_ids.device
    source, position = source.to(device), position.to(device)
    ids = torch.where(source >= 0, input_ids.reshape(-1)[source.clamp(min=0)], 0)
    return PackedRows(
        input_ids=ids,
        position_ids=position,
        sequence_starts=(position == 0) & (source >= 0),
        source=source,
        padded_shape=(batch, width),
        segments=Segments.of_spans(spans, len(bins) * packed_width, device),
    )


def probe_rows(vocab_size: int, width: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A right-padded probe batch for :func:`check_packing`: input_ids, attention_mask [3, width].

    One full-width row and two half rows, which packing lays back to back in one row: the probe covers a
    sequence as long as ``width`` and a sequence that starts inside a packed row. Token ids are drawn from
    ``[0, vocab_size)`` with a generator seeded with ``seed``, the same on every rank.
    """
    lengths = torch.tensor([width, (width + 1) // 2, width // 2]).clamp(min=1)
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab_size, (3, width), generator=generator)
    attention_mask = (torch.arange(width)[None] < lengths[:, None]).long()
    return input_ids * attention_mask, attention_mask


def probe_width(model_config, longest: int) -> int:
    """Tokens in the probe's longest row: past the narrowest attention window the model declares (a sliding
    window, or Llama 4's attention chunks), so that the window is exercised, capped at ``longest``, the run's
    longest sequence: a window no sequence of the run outgrows makes no difference to it."""
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    windows = [w for w in (getattr(text, "sliding_window", None), getattr(text, "attention_chunk_size", None)) if w]
    return max(2, min(min(windows, default=24) + 8, longest))


def packing_tolerance(dtype: torch.dtype) -> float:
    """The largest |packed - padded| :func:`check_packing` accepts for a model computing in ``dtype``: 1e-3 in fp32
    (the two layouts differ only in the order of floating-point sums, ~1e-6 at the sizes tested); 8 ulp of 1.0 in
    bf16 (0.0625) or fp16, where the layouts' different kernels round differently."""
    return max(1e-3, 8 * torch.finfo(dtype).eps)


def check_packing(
    key: str, model_config, what: str, padded: torch.Tensor, packed: torch.Tensor, valid: torch.Tensor, tolerance: float
) -> float:
    """Refuse ``key`` (``policy.sequence_packing`` or ``value.sequence_packing``) when the model computes something
    else on packed rows than on padded ones. padded, packed: [B, T] per-token results of the probe batch (``what``:
    log-probs or values) through the two layouts; valid: [B, T] bool, the tokens compared. Returns the largest
    difference; raises InputError naming the model and the difference when it exceeds ``tolerance``."""
    diff = (packed.float() - padded.float()).abs().masked_fill(~valid.bool(), 0.0).max().item()
    if not diff <= tolerance:  # NaN fails too
        name = getattr(model_config, "_name_or_path", "") or "built from config"
        raise InputError(
            f"{key}: the {model_config.model_type} model ({name}) computes other {what} on packed rows than on "
            f"padded ones (largest difference {diff:.3g} > {tolerance:.3g} on a probe of {valid.shape[1]}-token "
            f"rows): its attention does not follow the packed sequences' position_ids; set {key}: false"
        )
    return diff
