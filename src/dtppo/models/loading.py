"""One line, naming the path, for a model or tokenizer that cannot be loaded."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from dtppo.faults import InputError


@contextmanager
def loading_from(path: str) -> Iterator[None]:
    """Turn a failure of ``from_pretrained(path)`` into an ``InputError`` naming ``path``."""
    try:
        yield
    # transformers refuses a directory in many ways (no or broken config.json, unknown architecture, missing or
    # corrupt weights, a hub name without network): each becomes one line; DTPPO_DEBUG=1 shows the traceback.
    except Exception as err:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise InputError(f"{path}: cannot load a model or tokenizer from it: {type(err).__name__}: {detail}"
                         ) from err
