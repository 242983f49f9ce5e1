"""The record every data source yields (``dtppo.data.problem``): a prompt as text or chat messages, the reference,
and the row's other columns, which do not make two problems differ."""

import pytest

from dtppo.data.problem import Problem


def test_a_problem_is_conversational_when_its_prompt_is_chat_messages():
    assert not Problem("What is 2+3?", "2+3=5\n#### 5", "5").conversational
    assert Problem([{"role": "user", "content": "What is 2+3?"}], "", "5").conversational


def test_the_columns_are_carried_but_not_compared():
    a = Problem("Q", "", "1", {"level": 1})
    assert a == Problem("Q", "", "1", {"level": 2}) and a.columns == {"level": 1}
    assert a != Problem("Q", "", "2") and Problem("Q", "", None).columns == {}


def test_a_problem_is_frozen():
    with pytest.raises(AttributeError):
        Problem("Q", "", "1").answer = "2"
