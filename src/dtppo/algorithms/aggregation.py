"""Loss aggregation: how a minibatch's per-token losses become the one number an optimizer step descends.

Every mode is a weighted sum ``Σ_{b,t} w[b,t]·L[b,t]`` whose weights depend on the minibatch's mask only, computed
once over the whole minibatch before it is split over data-parallel ranks and microbatches: each rank and each
microbatch adds its rows' share, so the gradient is the same for any split (verl's global ``loss_agg_mode``;
per-microbatch normalisation, verl#6957 and NeMo-RL#2839, makes the effective learning rate depend on the split).
"""

from __future__ import annotations

import torch


def loss_token_weights(mask: torch.Tensor, mode: str, horizon: int) -> torch.Tensor:
    """The weight of each token's loss in the minibatch's loss. mask: [B, T] float32, the tokens that train (a row
    with none does not count as a sequence); horizon: the constant of ``seq-mean-token-sum-norm`` -> [B, T] float32,
    0 off the mask.

    With N trained tokens, S sequences that have one, n_b tokens in sequence b and H = ``horizon``:
    ``token-mean`` 1/N (DAPO, Yu et al. 2025, eq. 8); ``token-sum`` 1; ``seq-mean-token-sum`` 1/S;
    ``seq-mean-token-mean`` 1/(S·n_b) (GRPO, Shao et al. 2024, eq. 3); ``seq-mean-token-sum-norm`` 1/(S·H)
    (Dr. GRPO, Liu et al. 2025, eq. 2: a constant, so no length bias).
    """
    mask = mask.float()
    lengths = mask.sum(-1, keepdim=True)
    sequences = (lengths > 0).sum().clamp(min=1)
    if mode == "token-mean":
        return mask / mask.sum().clamp(min=1)
    if mode == "token-sum":
        return mask
    if mode == "seq-mean-token-sum":
        return mask / sequences
    if mode == "seq-mean-token-mean":
        return mask / (lengths.clamp(min=1) * sequences)
    if mode == "seq-mean-token-sum-norm":
        return mask / (sequences * horizon)
    raise ValueError(f"unknown loss aggregation {mode!r}")
