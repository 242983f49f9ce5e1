"""Reward-function specs as recipes write them (``dtppo.config.reward_spec``): a built-in name, a file and a
callable, a module and a callable; a malformed one says what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from dtppo.config.reward_spec import FunctionSpec, parse_spec


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gsm8k", FunctionSpec("gsm8k", "builtin", "gsm8k", "gsm8k")),
        ("math", FunctionSpec("math", "builtin", "math", "math")),
        ("rewards.py:score", FunctionSpec("rewards.py:score", "file", "rewards.py", "score")),
        ("dir/r:score", FunctionSpec("dir/r:score", "file", "dir/r", "score")),
        ("C:\\r.py:score", FunctionSpec("C:\\r.py:score", "file", "C:\\r.py", "score")),
        ("pkg.mod:length_bonus", FunctionSpec("pkg.mod:length_bonus", "module", "pkg.mod", "length_bonus")),
    ],
)
def test_each_form_parses_to_its_kind_and_metric_name(text, expected):
    spec = parse_spec(text)
    assert spec == expected and spec.name == expected.attribute


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("rewards.py", "neither a built-in"),
        ("gsm 9k", "neither a built-in"),
        (":score", "neither a built-in"),
        ("rewards.py:", "neither a built-in"),
        ("rewards.py:not-a-name", "is not a Python name"),
        ("pkg.2mod:score", "is not a module name"),
    ],
)
def test_a_malformed_spec_says_what_is_wrong(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_spec(text)


def test_absolute_resolves_a_file_and_leaves_the_others(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_spec("r.py:score").absolute() == f"{Path(tmp_path / 'r.py').resolve()}:score"
    assert parse_spec("pkg.mod:score").absolute() == "pkg.mod:score"
    assert parse_spec("gsm8k").absolute() == "gsm8k"
