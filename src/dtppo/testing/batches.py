"""Made-up batches (``Experience``) for the tests and benchmarks of workers, engines and ranks: every tensor a function
of the arguments, so that a test can assert numbers."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dtppo.types import Experience, build_response_mask


def synthetic_experience(
    vocab: int | None = None,
    batch: int = 8,
    seed: int = 0,
    *,
    prompt_lengths: range | Sequence[int] = range(4, 12),
    response_lengths: range | Sequence[int] = range(1, 14),
    short_first_half: range | None = range(1, 4),
    first_id: int = 3,
    rewards: bool = True,
    targets: bool = True,
    width: int = 6,
    response_mask: torch.Tensor | None = None,
) -> Experience:
    """``batch`` made-up rows, of one of two kinds.

    Token rows (``vocab`` given), for models: each row a prompt then a response, right-padded to the longest.
    A length argument is a ``range`` to draw each row's length from, or the rows' lengths; ``short_first_half``
    (a range, or None) redraws the first half's response lengths (rank 0 then holds short responses: ranks hold
    unequal valid-token counts). Ids are drawn from ``[first_id, vocab)`` and are 0 on padding; ``rewards`` adds
    [B] rewards in [0, 1), ``targets`` standard-normal advantages and returns on the response. Everything is drawn
    from one ``torch.Generator`` seeded ``seed``, in this order: prompt lengths, response lengths, the first half's,
    ids, rewards, advantages, returns.

    Feature rows (``vocab=None``), for toy models that read ``input_ids`` as numbers: [batch, width]
    standard-normal ``input_ids`` and ``returns``, every position attended, ``response_mask`` the positions trained
    (default: all). Drawn from torch's global generator after ``torch.manual_seed(seed)``, which this call leaves
    seeded so.
    """
    if vocab is None:
        return _feature_rows(batch, width, seed, response_mask)
    g = torch.Generator().manual_seed(seed)
    prompt = _lengths(prompt_lengths, batch, g)
    response = _lengths(response_lengths, batch, g)
    if short_first_half is not None:
        response[: batch // 2] = torch.randint(
            short_first_half.start, short_first_half.stop, (batch // 2,), generator=g
        )
    width = int((prompt + response).max())
    ids = torch.randint(first_id, vocab, (batch, width), generator=g)
    attention = (torch.arange(width)[None] < (prompt + response)[:, None]).long()
    mask = build_response_mask(prompt, response, width)
    drawn = {}
    if rewards:
        drawn["rewards"] = torch.rand(batch, generator=g)
    if targets:
        drawn["advantages"] = torch.randn(batch, width, generator=g) * mask
        drawn["returns"] = torch.randn(batch, width, generator=g) * mask
    return Experience(
        input_ids=ids * attention,
        attention_mask=attention,
        response_mask=mask,
        gen_logprobs=torch.zeros(batch, width),
        truncated=torch.zeros(batch, dtype=torch.bool),
        **drawn,
    )


def _feature_rows(batch: int, width: int, seed: int, response_mask: torch.Tensor | None) -> Experience:
    torch.manual_seed(seed)
    return Experience(
        input_ids=torch.randn(batch, width),
        attention_mask=torch.ones(batch, width, dtype=torch.long),
        response_mask=torch.ones(batch, width) if response_mask is None else response_mask,
        gen_logprobs=torch.zeros(batch, width),
        truncated=torch.zeros(batch, dtype=torch.bool),
        returns=torch.randn(batch, width),
    )


def unequal_rows_mask(batch: int, width: int, stride: int = 1) -> torch.Tensor:
    """[batch, width] response mask of rows with unequal valid-token counts: row b trains positions 1 through
    1 + (stride · b) mod (width − 1)."""
    mask = torch.zeros(batch, width)
    for b in range(batch):
        mask[b, 1 : 2 + (stride * b) % (width - 1)] = 1
    return mask


def _lengths(lengths: range | Sequence[int], batch: int, g: torch.Generator) -> torch.Tensor:
    if isinstance(lengths, range):
        return torch.randint(lengths.start, lengths.stop, (batch,), generator=g)
    if len(lengths) != batch:
        raise ValueError(f"{len(lengths)} lengths for a batch of {batch}")
    return torch.tensor(list(lengths))
