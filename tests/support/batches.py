"""Made-up batches for the tests (``dtppo.testing.batches``), and a spy on the forwards' packing."""

from __future__ import annotations

from dtppo.testing.batches import synthetic_experience, unequal_rows_mask

__all__ = ["spy_on_packing", "synthetic_experience", "unequal_rows_mask"]


def spy_on_packing(monkeypatch) -> list[tuple[int, int]]:
    """Record every packing of a batch by the policy's and the critic's forward (``models.packing.pack_rows``, as
    ``models.logprobs`` and ``models.value`` call it): (rows in, packed rows out) per call. A test that compares
    packed with padded asserts with it that the packed path ran and packed."""
    from dtppo.models import logprobs, packing, value

    calls: list[tuple[int, int]] = []

    def recorded(input_ids, attention_mask, *args, **kwargs):
        packed = packing.pack_rows(input_ids, attention_mask, *args, **kwargs)
        calls.append((input_ids.shape[0], packed.num_rows))
        return packed

    for module in (logprobs, value):
        monkeypatch.setattr(module, "pack_rows", recorded)
    return calls
