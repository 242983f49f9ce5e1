"""What a Python caller gives a run (``dtppo.usercode.given``): closures, lambdas and rows travel to other processes
by value through any pickler, and what cannot travel is named in one line before anything starts."""

import pickle
import threading

import pytest

from dtppo.errors import InputError
from dtppo.usercode.given import GivenInputs


def _closure(scale):
    def scaled(completions, **kwargs):
        return [scale * len(c) for c in completions]

    return scaled


def test_closures_lambdas_and_rows_survive_the_standard_pickler():
    given = GivenInputs(
        (("scaled", _closure(3.0)), ("short", lambda completions, **kw: [float(len(c) < 3) for c in completions])),
        train_rows=[{"prompt": "p", "topic": "stars"}],
    )
    back = pickle.loads(pickle.dumps(given))  # what forkserver, spawn and a process pool's arguments go through
    assert back.function("scaled")(completions=["ab", "abcd"]) == [6.0, 12.0]
    assert back.function("short")(completions=["ab", "abcd"]) == [1.0, 0.0]
    assert back.train_rows == [{"prompt": "p", "topic": "stars"}] and back.validation_rows is None
    assert back.function("absent") is None


def test_a_scoring_process_gets_the_functions_without_the_rows():
    given = GivenInputs((("f", len),), train_rows=[{"prompt": "p"}], validation_rows=[{"prompt": "q"}])
    assert given.functions_only() == GivenInputs((("f", len),))


def test_a_function_that_cannot_travel_is_named_in_one_line():
    lock = threading.Lock()

    def guarded(completions, **kwargs):
        with lock:
            return [0.0] * len(completions)

    given = GivenInputs((("fine", _closure(1.0)), ("guarded", guarded)))
    with pytest.raises(InputError) as err:
        given.check_portable("the 2 ranks")
    message = str(err.value)
    assert message.startswith("reward function 'guarded' cannot be sent to the 2 ranks: TypeError:")
    assert "lock" in message and "\n" not in message and err.value.exit_code == 2
    GivenInputs((("fine", _closure(1.0)),)).check_portable("the 2 ranks")  # the negative control: it travels


def test_rows_that_cannot_travel_are_named():
    with pytest.raises(InputError, match="^eval_dataset cannot be sent to Ray"):
        GivenInputs(validation_rows=[{"prompt": threading.Lock()}]).check_portable("Ray")
