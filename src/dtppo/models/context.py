"""A context-parallel forward: global rows cut into this rank's tokens, and per-token results gathered back.

Everything a forward reads across positions is built on the global row before it is cut: position ids (padded
rows: 0..T-1; packed rows: their per-sequence ones), where sequences start, and (``models.logprobs``) the
next-token ids. The rows are padded to a multiple of 2·cp with token 0 after their last token, which causal
attention keeps from every real token. A per-token result comes back as the global row, where the one shift
helper aligns it (``ops.shift_right``): no rank shifts its own tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dtppo.distributed.context import ContextShards
from dtppo.models.attention import ContextRows


@dataclass(frozen=True)
class ContextForward:
    """This rank's share of rows ``[B, T]``.

    width:        T, the global rows' width before padding
    input_ids:    [B, n] int64, this rank's tokens (n = the padded width / cp)
    position_ids: [B, n] int64, their global positions (per sequence in packed rows)
    rows:         the rows' sequences for the attention kernel (``models.attention.ContextRows``)
    """

    shards: ContextShards
    width: int
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    rows: ContextRows

    @staticmethod
    def of(
        shards: ContextShards,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        sequence_starts: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> ContextForward:
        """input_ids: [B, T] global rows, right-padded or packed; position_ids: [B, T] (None: 0..T-1 in every row);
        sequence_starts: [B, T] bool, packed rows' sequence starts (None: one sequence per row). attention_mask:
        the padding mask the rows would need (``models.packing.needed_mask``): must be None, since the attention
        of a cut row takes no mask."""
        if attention_mask is not None:
            raise ValueError("context parallelism takes right-padded or packed rows (no padding mask)")
        batch, width = input_ids.shape
        device = input_ids.device
        if position_ids is None:
            position_ids = torch.arange(width, device=device).expand(batch, -1)
        pad = shards.width(width) - width
        starts = torch.zeros(batch, width + pad, dtype=torch.bool, device=device)
        if sequence_starts is not None:
            starts[:, :width] = sequence_starts.bool()
        # The padding continues each row's last sequence: after every real token, so invisible to them.
        positions = torch.cat([position_ids, position_ids[:, -1:] + torch.arange(1, pad + 1, device=device)], dim=1)
        return ContextForward(
            shards,
            width,
            shards.shard(F.pad(input_ids, (0, pad))),
            shards.shard(positions),
            ContextRows.of(shards, starts),
        )

    def shard(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's positions of a global per-token tensor. x: [B, T, ...] -> [B, n, ...] (0 on the padding)."""
        pad = self.shards.width(self.width) - self.width
        padded = torch.cat([x, x.new_zeros((x.shape[0], pad, *x.shape[2:]))], dim=1)
        return self.shards.shard(padded)

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """Global rows of a per-token result every rank of the group goes on with alike (a loss, a metric).
        local: [B, n, ...] -> [B, T, ...]; backward: this rank's positions."""
        return self.shards.gather_outputs(local)[:, : self.width]
