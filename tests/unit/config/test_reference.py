"""The recipe reference generated from the schema (``dtppo.config.reference``): every key with its type, default and
docstring, the renamed keys; docs/guides/config.md is its output (tests/repo/test_reference_docs.py)."""

from __future__ import annotations

from typing import Literal

from dtppo.config import RENAMES, ValidationConfig
from dtppo.config.reference import config_reference, default_text, field_docs, recipe_key, type_text


def test_types_and_defaults_read_as_a_recipe_writes_them():
    assert type_text(int | None) == "int or null"
    assert type_text(Literal["token", "sequence"] | None) == "token \\| sequence or null"
    assert type_text(tuple[str, ...]) == "list of str"
    assert type_text(tuple[float, float]) == "[float, float]"
    assert [default_text(v) for v in (None, True, (0.9, 0.95), "", "k3", 2.0)] == [
        "null",
        "true",
        "[0.9, 0.95]",
        '""',
        "k3",
        "2.0",
    ]
    assert (recipe_key("class_"), recipe_key("lr")) == ("class", "lr")


def test_each_field_keeps_the_docstring_under_it():
    docs = field_docs(ValidationConfig)
    assert set(docs) == {"period", "at_start", "max_samples", "batch_size", "greedy"}
    assert docs["period"] == "Validate every N steps (and at the last step)."


def test_the_reference_holds_every_subsection_and_the_renamed_keys():
    text = config_reference()
    for heading in ("## `ppo.validation`", "## `ppo.gae`", "## `value.warmup`", "## `loss.rollout_correction`"):
        assert heading in text
    assert "| `period` | int | `10` |" in text
    for old, new in RENAMES.items():
        assert f"| `{old}` | `{new}` |" in text
