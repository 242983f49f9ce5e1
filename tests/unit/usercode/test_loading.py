"""Loading the user's code a spec names (``dtppo.usercode.loading``): a file once per path, registered so its own
classes pickle; a module by import; and each way it can fail one error of the caller's kind naming the spec."""

import pickle
import sys

import pytest

from dtppo.config.reward_spec import parse_spec
from dtppo.errors import InputError
from dtppo.usercode.loading import load_callable


class Refused(InputError):
    """The caller's own error kind (reward functions and environments each have one)."""


def _file(tmp_path, text: str, name: str = "user.py") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_file_is_loaded_once_and_its_classes_pickle(tmp_path):
    path = _file(
        tmp_path, "import dataclasses\n@dataclasses.dataclass\nclass Box:\n    x: int\ndef f(x):\n    return x\n"
    )
    box = load_callable(parse_spec(f"{path}:Box"), "environment", Refused)
    assert load_callable(parse_spec(f"{path}:f"), "environment", Refused)(3) == 3
    assert box.__module__ in sys.modules and sys.modules[box.__module__].Box is box  # one module for the path
    assert pickle.loads(pickle.dumps(box(4))) == box(4)


def test_a_module_is_imported():
    assert load_callable(parse_spec("json:dumps"), "reward function", Refused)([1]) == "[1]"


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("{dir}/missing.py:f", "file not found: {dir}/missing.py"),
        ("{dir}/user.py:g", "{dir}/user.py has no 'g'"),
        ("{dir}/user.py:VALUE", "VALUE is a int, not callable"),
        ("{dir}/broken.py:f", "importing {dir}/broken.py raised ZeroDivisionError: division by zero"),
        ("no_such_module_xyz:f", "cannot import no_such_module_xyz: ModuleNotFoundError"),
    ],
)
def test_each_failure_is_the_callers_error_naming_the_spec(tmp_path, spec, fragment):
    _file(tmp_path, "VALUE = 3\ndef f():\n    pass\n")
    _file(tmp_path, "1 / 0\ndef f():\n    pass\n", "broken.py")
    spec, fragment = spec.format(dir=tmp_path), fragment.format(dir=tmp_path)
    with pytest.raises(Refused) as err:
        load_callable(parse_spec(spec), "reward function", Refused)
    assert str(err.value).startswith(f"reward function {spec!r}: ") and fragment in str(err.value)


def test_a_file_that_failed_to_import_is_tried_again_once_fixed(tmp_path):
    path = _file(tmp_path, "raise RuntimeError('not yet')\n")
    with pytest.raises(Refused, match="RuntimeError: not yet"):
        load_callable(parse_spec(f"{path}:f"), "environment", Refused)
    _file(tmp_path, "def f():\n    return 1\n")
    assert load_callable(parse_spec(f"{path}:f"), "environment", Refused)() == 1
