"""The small rules every section's own checks use (``dtppo.config.rules``): each raises ConfigError naming the field."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dtppo.config.rules import ConfigError, at_least, names_a_directory, require


def test_require_names_the_key_and_the_problem():
    require(True, "lr", "must be > 0")
    with pytest.raises(ConfigError, match=r"^lr: must be > 0$"):
        require(False, "lr", "must be > 0")


def test_at_least_checks_every_named_field_and_names_the_first_short_one():
    section = SimpleNamespace(a=1, b=0, c=-1)
    at_least(section, 0, "a", "b")
    with pytest.raises(ConfigError, match=r"^b: must be >= 1, got 0$"):
        at_least(section, 1, "a", "b", "c")


@pytest.mark.parametrize("value", ["", "   "])
def test_a_directory_key_refuses_an_empty_name(value):
    names_a_directory(SimpleNamespace(d="runs/x"), "d")
    with pytest.raises(ConfigError, match=r"^d: must name a directory"):
        names_a_directory(SimpleNamespace(d=value), "d")


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)
