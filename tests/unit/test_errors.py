"""The errors that stop a run (``dtppo.errors``): each a ``RunStopped`` with its own exit code, 1 for the base class
(what the CLI exits with: docs/guides/reliability.md's table, checked against the classes by
tests/repo/test_reference_docs.py), and the message the one line on stderr."""

import pytest

from dtppo import errors

CODES = {
    errors.RunStopped: 1,
    errors.InputError: 2,
    errors.NonFiniteError: 3,
    errors.CheckpointError: 4,
    errors.BelowFloorError: 5,
    errors.GenerationError: 6,
}


def test_each_stop_has_its_own_exit_code():
    assert {cls: cls.exit_code for cls in CODES} == CODES
    assert len(set(CODES.values())) == len(CODES)


def test_every_stop_is_a_run_stopped_and_a_runtime_error():
    for cls in CODES:
        assert issubclass(cls, errors.RunStopped) and issubclass(cls, RuntimeError)


def test_the_module_defines_no_stop_this_test_does_not_know():
    defined = {v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, errors.RunStopped)}
    assert defined == set(CODES)


def test_the_message_is_the_explanation_and_the_class_keeps_its_code_when_raised():
    with pytest.raises(errors.RunStopped) as err:
        raise errors.CheckpointError("step_3: manifest.json is missing")
    assert str(err.value) == "step_3: manifest.json is missing" and err.value.exit_code == 4
