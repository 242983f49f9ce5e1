"""The calculator example (examples/calculator.py) and SFT on transcripts: arithmetic parsed, never executed; a
worked solution split into the assistant's turns and the environment's observations, only the former trained."""

import importlib.util

import pytest
import torch

from dtppo.config import EnvConfig
from dtppo.data.chat import ChatFormat
from dtppo.data.problem import Problem
from dtppo.envs.client import EnvClient
from dtppo.envs.transcripts import transcript_episodes
from dtppo.errors import InputError
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.types import build_episode_rows
from tests.support.recipes import REPO

EXAMPLES = REPO / "examples"
# examples/ is not a package: the example is imported from its file.
_SPEC = importlib.util.spec_from_file_location("calculator", EXAMPLES / "calculator.py")
calculator = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(calculator)
Calculator, calculate = calculator.Calculator, calculator.calculate

TOK = build_char_tokenizer()


def test_calculate_parses_arithmetic_and_refuses_anything_else():
    assert calculate("523+312", 12) == 835 and calculate("(2-5)*3", 12) == -9 and calculate(" 7 ", 12) == 7
    for bad in ["__import__('os')", "2**99", "1/2", "a+1", "9" * 70, "1e3", "True+1"]:
        with pytest.raises(ValueError):
            calculate(bad, 12)
    with pytest.raises(ValueError, match="too large"):
        calculate("99999999*99999999", 12)


def test_the_calculator_answers_a_call_and_ends_on_an_answer():
    env = Calculator()
    state = env.reset({"prompt": "q"})
    assert env.step(state, "<calc>12*37</calc>") == ("<result>444</result>\n", 0.0, False)
    assert env.step(state, "<calc>12/0</calc>") == ("<result>error</result>\n", 0.0, False)
    assert env.step(state, "#### 444") == (None, 0.0, True) and state["calls"] == 2


def _client():
    return EnvClient(EnvConfig(class_=f"{EXAMPLES}/calculator.py:Calculator", num_workers=0, stop=("</calc>",)))


def test_a_transcript_is_split_into_turns_and_only_the_assistant_is_trained():
    solution = "<calc>523+312</calc><result>835</result>\n#### 835"
    problems = [Problem("Q", solution, "835"), Problem("Q2", "2 + 3 = 5\n#### 5", "5")]
    episodes = transcript_episodes(TOK, ChatFormat(), _client(), ("</calc>",), problems, [0, 1])
    rows = build_episode_rows([[5], [5]], episodes, [0, 0], TOK.pad_token_id)
    trained = [TOK.decode(r[m.bool()].tolist()) for r, m in zip(rows.input_ids, rows.response_mask)]
    assert trained == ["<calc>523+312</calc>#### 835<eos>", "2 + 3 = 5\n#### 5<eos>"]
    whole = TOK.decode(rows.input_ids[0, 1 : int(rows.attention_mask[0].sum())].tolist())
    assert whole == solution + "<eos>"
    assert rows.turn_ids[0].max() == 2 and rows.turn_ids[1].max() == 1
    assert torch.equal(rows.gen_logprobs, torch.zeros_like(rows.gen_logprobs))


def test_a_transcript_the_environment_would_not_produce_is_refused():
    wrong = [Problem("Q", "<calc>2+2</calc><result>5</result>\n#### 5", "5")]
    with pytest.raises(InputError, match=r"sample 0: after its turn 1 .* answers '<result>4</result>\\n'"):
        transcript_episodes(TOK, ChatFormat(), _client(), ("</calc>",), wrong, [0])
