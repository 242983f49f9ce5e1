"""What every section's own checks share: the error a bad recipe raises, and the small rules that raise it."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A recipe or override is invalid; the message names the dotted key."""


def require(ok: bool, key: str, problem: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {problem}")


def at_least(section: Any, minimum: int, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        require(value >= minimum, name, f"must be >= {minimum}, got {value}")


def names_a_directory(section: Any, name: str) -> None:
    require(getattr(section, name).strip() != "", name, "must name a directory, got an empty string")
