"""Tied parameters (an lm_head that is the input embedding): stored once, under the first of their names."""

from __future__ import annotations

from typing import TypeVar

from torch import nn

V = TypeVar("V")


def tied_names(model: nn.Module) -> dict[str, str]:
    """{alias: first name} for every parameter reachable under more than one name (``named_parameters`` order)."""
    first: dict[int, str] = {}
    aliases = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            aliases[name] = first[id(param)]
        else:
            first[id(param)] = name
    return aliases


def untied(state: dict[str, V], tied: dict[str, str]) -> dict[str, V]:
    """``state`` without the aliases of ``tied`` (:func:`tied_names`)."""
    return {name: value for name, value in state.items() if name not in tied}
