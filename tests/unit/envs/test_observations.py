"""How an observation enters an episode's tokens (``dtppo.envs.observations``): none for None or an empty one, text
as it is, chat messages as the chat template's text after the turn, and a template that cannot give that text
refused in one line naming the observation."""

import pytest

from dtppo.data.chat import ChatFormat
from dtppo.envs.interface import EnvironmentFailure
from dtppo.envs.observations import observation_tokens
from dtppo.models.tokenizer import build_char_tokenizer

TOK = build_char_tokenizer()
EOS = TOK.eos_token_id


def test_no_observation_adds_no_tokens():
    assert observation_tokens(TOK, ChatFormat(), None, [EOS]) == []
    assert observation_tokens(TOK, ChatFormat(), "", [EOS]) == []
    assert observation_tokens(TOK, ChatFormat(), [], [EOS]) == []


def test_text_is_tokenized_as_it_is_and_messages_as_the_template_renders_them():
    assert TOK.decode(observation_tokens(TOK, ChatFormat(), "<result>1</result>", [EOS])) == "<result>1</result>"
    # The character tokenizer's template prints a message's content, then the answer header after the last one.
    tool = [{"role": "tool", "content": "7"}]
    assert TOK.decode(observation_tokens(TOK, ChatFormat(), tool, [EOS])) == "7\nAnswer: "
    assert TOK.decode(observation_tokens(TOK, ChatFormat(), tool, [])) == "7\nAnswer: "  # no turn tokens known


def test_a_template_whose_turn_text_depends_on_the_turns_before_is_one_line_naming_the_observation():
    counting = build_char_tokenizer()
    counting.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{{ messages | length }}"
    tool = [{"role": "tool", "content": "7"}]
    with pytest.raises(EnvironmentFailure, match=r"an observation given as chat messages .*'7'.* TurnTextError") as err:
        observation_tokens(counting, ChatFormat(), tool, [EOS])
    assert "\n" not in str(err.value) and "give the observation as text" in str(err.value)
    assert observation_tokens(counting, ChatFormat(), "as text", [EOS]) != []  # text never asks the template
