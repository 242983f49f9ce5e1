"""The text between an episode's turns is what the family's chat template renders for the same conversation: a
3-turn episode (prompt, response, observation, response, observation, response) built by dtppo's episode loop equals
``apply_chat_template`` of its messages, token for token, with the real templates of Qwen2.5, Qwen3 (thinking on and
off), Llama 3.2, Mistral v0.3 and Gemma 3 (tests/support/chat_templates.py). Negative controls: the derivation dtppo
had before (a neutral exchange cut off) loses Qwen's ``\\n`` after ``<|im_end|>`` and refuses Qwen3; a template whose
turn text depends on the turns before it is refused, at the first such observation and at preflight."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from dtppo.config import ConfigError, EnvConfig
from dtppo.data.chat import ChatFormat, TurnTextError
from dtppo.data.problem import Problem
from dtppo.envs.interface import EnvironmentFailure
from dtppo.envs.transcripts import transcript_episodes
from dtppo.generation.episodes import EpisodeGenerator
from dtppo.launch.preflight import preflight
from dtppo.types import SampleRequest, SamplingParams, Segment, build_episode_rows
from tests.support import chat_templates as ct
from tests.support.hf_fixtures import with_chat_template
from tests.support.recipes import REPO, tiny_config

SCRIPTED = f"{REPO / 'tests' / 'support' / 'scripted_env.py'}:Scripted"
EMPTY_THINK = "<think>\n\n</think>\n\n"
# A template in the manner of ChatGLM2's, which numbers its rounds: what it renders after an assistant turn depends
# on how many came before, so no text of an observation turn is right for every episode.
ROUNDS_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}[Round {{ loop.index0 // 2 + 1 }}]\n问：{{ m['content'] }}\n"
    "{% else %}答：{{ m['content'] }}\n\n{% endif %}{% endfor %}{% if add_generation_prompt %}答：{% endif %}"
)


@functools.cache
def tokenizer(family: str):
    return ct.chat_tokenizer(ct.FAMILIES[family])


class Scripted:
    """A ``Generator`` whose k-th call answers every prompt with turn k of ``turns`` (its text, then the token
    ``end``), and an environment whose k-th step answers with ``observations[k]`` (then nothing)."""

    def __init__(self, tok, end: str, turns: list[str], observations: list[list[dict]]):
        self.tok, self.end, self.turns, self.observations = tok, tok.convert_tokens_to_ids(end), turns, observations
        self.calls = self.steps = 0

    def sample(self, request):
        text, self.calls = self.turns[self.calls], self.calls + 1
        ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.end]
        segments = [[Segment(ids, 1, [0.0] * len(ids))] for _ in request.prompts]
        return build_episode_rows(request.prompts, segments, [0] * len(request.prompts), self.tok.pad_token_id)

    def reset(self, rows, ids):
        return [{} for _ in rows]

    def step(self, states, texts, ids):
        k, self.steps = self.steps, self.steps + 1
        observation = self.observations[k] if k < len(self.observations) else None
        return [(state, observation, 0.0, False) for state in states]

    def close(self):
        pass


def episode(family: str, chat: ChatFormat, turns: list[str], observations: list[list[dict]], tok=None):
    """dtppo's episode (prompt + 3 turns + 2 observations) as (token ids, text with special tokens), with the
    family's tokenizer (or ``tok``, a tokenizer in the family's tokens)."""
    tok = tok or tokenizer(family)
    script = Scripted(tok, ct.FAMILIES[family].turn_end, turns, observations)
    prompt = tok(chat.render(tok, [{"role": "user", "content": "Q"}], add_generation_prompt=True))["input_ids"]
    cfg = EnvConfig(class_=SCRIPTED, num_workers=0, max_turns=len(turns), max_total_tokens=512)
    loop = EpisodeGenerator(script, script, tok, cfg, chat)
    rows = loop.sample(SampleRequest([prompt], SamplingParams(64), 0, torch.arange(1), [{}]))
    ids = rows.input_ids[0, : int(rows.attention_mask[0].sum())].tolist()
    return ids, tok.decode(ids)


def messages(turns: list[str], observations: list[list[dict]]) -> list[dict]:
    out = [{"role": "user", "content": "Q"}]
    for k, turn in enumerate(turns):
        out += [{"role": "assistant", "content": turn}] + (observations[k] if k < len(observations) else [])
    return out


def tool(content: str) -> list[dict]:
    return [{"role": "tool", "content": content}]


def user(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


THINKING = [
    "<think>\nadd them\n</think>\n\nA1 call",
    "<think>\nnow times\n</think>\n\nA2 call",
    "<think>\nso\n</think>\n\nA3",
]
PLAIN = ["A1 call", "A2 call", "A3 done"]
# family, template variables, turns, observations, what the template renders after the last turn's closing token
CASES = {
    "qwen2.5": ("qwen2.5", (), PLAIN, [tool("7"), tool("42")], "\n"),
    "qwen3-thinking": ("qwen3", (("enable_thinking", True),), THINKING, [tool("7"), tool("42")], "\n"),
    "llama3": ("llama3", (("date_string", "26 Jul 2024"),), PLAIN, [tool("7"), tool("42")], ""),
    "mistral": ("mistral", (), [" A1 call", " A2 call", " A3 done"], [user("7"), user("42")], ""),
    "gemma3": ("gemma3", (), PLAIN, [user("7"), user("42")], "\n"),
}


@pytest.mark.parametrize("case", CASES)
def test_an_episode_is_the_templates_rendering_of_its_conversation(case):
    family, kwargs, turns, observations, rest = CASES[case]
    chat, tok = ChatFormat(None, kwargs), tokenizer(family)
    ids, text = episode(family, chat, turns, observations)
    rendered = chat.render(tok, messages(turns, observations), add_generation_prompt=False)
    assert text + rest == rendered
    assert ids == tok(rendered, add_special_tokens=False)["input_ids"][: len(ids)]


def test_qwen3_without_thinking_each_turn_follows_the_templates_generation_prompt():
    chat, tok = ChatFormat(None, (("enable_thinking", False),)), tokenizer("qwen3")
    observations = [tool("7"), tool("42")]
    _, text = episode("qwen3", chat, PLAIN, observations)
    # Each turn was sampled after the generation prompt the template renders for the conversation so far (the
    # empty think block included), and the text between two turns is the template's: the assistant's closing with
    # its "\n", the tool's turn, the next generation prompt.
    for k in range(1, 3):
        so_far = chat.render(tok, messages(PLAIN[:k], observations[:k]), add_generation_prompt=True)
        assert so_far.endswith("<|im_start|>assistant\n" + EMPTY_THINK)
        between = text.split(PLAIN[k - 1])[1].split(PLAIN[k])[0]
        assert between == so_far.split(PLAIN[k - 1])[1]
        assert between.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n")
    # The whole conversation's rendering drops the empty think block of every assistant message but the last (Qwen3's
    # history rule); the episode keeps the tokens each turn was sampled after.
    rendered = chat.render(tok, messages(PLAIN, observations), add_generation_prompt=False)
    assert text.count(EMPTY_THINK) == 3 and rendered.count(EMPTY_THINK) == 1
    assert text.replace(EMPTY_THINK, "", 2) + "\n" == rendered


def _old_turn_text(self, tok, observation, turn_end):
    """The derivation dtppo had before: a neutral exchange rendered, then cut off the rendering with the
    observation, refused when not a prefix."""
    context = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    before = self.render(tok, context, add_generation_prompt=False)
    after = self.render(tok, context + observation, add_generation_prompt=True)
    if not after.startswith(before):
        raise TurnTextError("this one rewrites earlier messages when more follow")
    return after[len(before) :]


def test_negative_control_the_old_derivation_loses_the_newline_and_refuses_qwen3(monkeypatch):
    family, kwargs, turns, observations, rest = CASES["qwen2.5"]
    chat, tok = ChatFormat(None, kwargs), tokenizer(family)
    rendered = chat.render(tok, messages(turns, observations), add_generation_prompt=False)
    monkeypatch.setattr(ChatFormat, "turn_text", _old_turn_text)
    _, text = episode(family, chat, turns, observations)
    assert text + rest != rendered
    tool_turn = "<|im_start|>user\n<tool_response>"
    assert text + rest == rendered.replace("<|im_end|>\n" + tool_turn, "<|im_end|>" + tool_turn)
    assert rendered.count(tool_turn) == 2  # the "\n" after each of the two assistant turns an observation follows
    with pytest.raises(EnvironmentFailure, match="TurnTextError: this one rewrites earlier messages"):
        episode("qwen3", ChatFormat(None, (("enable_thinking", False),)), PLAIN, [tool("7"), tool("42")])


def test_a_turn_ended_by_a_stop_string_gets_the_templates_closing_and_a_sampled_closing_is_not_doubled():
    chat, tok = ChatFormat(), tokenizer("qwen2.5")
    after_stop = chat.turn_text(tok, tool("7"), tok("</calc>", add_special_tokens=False)["input_ids"][-1])
    after_end = chat.turn_text(tok, tool("7"), tok.convert_tokens_to_ids("<|im_end|>"))
    turn = "<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert after_stop == "<|im_end|>\n" + turn and after_end == "\n" + turn
    assert chat.turn_text(tok, tool("7"), None) == after_stop


def test_a_template_whose_turn_text_depends_on_the_turns_before_is_refused(qwen_dir, tmp_path):
    rounds_tok = ct.chat_tokenizer(dataclasses.replace(ct.QWEN25, name="rounds", template=ROUNDS_TEMPLATE))
    with pytest.raises(TurnTextError, match="depends on the conversation before it"):
        ChatFormat().turn_text(rounds_tok, user("7"), None)
    # Negative control: the same call with Qwen2.5's template gives the text.
    assert ChatFormat().turn_text(tokenizer("qwen2.5"), user("7"), None).endswith("<|im_start|>assistant\n")
    rounds = with_chat_template(qwen_dir, tmp_path / "rounds", ROUNDS_TEMPLATE)
    qwen3 = with_chat_template(qwen_dir, tmp_path / "qwen3", ct.QWEN3_TEMPLATE)
    preflight(tiny_config("ppo.init_from_sft=false", f"policy.model.path={rounds}"))  # single-turn: its prompts render
    expected = r"^env\.class: .* cannot give that text \(TurnTextError: what it renders"
    with pytest.raises(ConfigError, match=expected) as refused:
        preflight(tiny_config("ppo.init_from_sft=false", f"policy.model.path={rounds}", f"env.class={SCRIPTED}"))
    assert "\n" not in str(refused.value)  # one line
    # In the episode loop (a hub model, which preflight does not read): one line at the first observation.
    with pytest.raises(EnvironmentFailure, match=r"^an observation given as chat messages .*TurnTextError") as failed:
        episode("qwen2.5", ChatFormat(), PLAIN, [user("7"), user("42")], tok=rounds_tok)
    assert "\n" not in str(failed.value)
    preflight(tiny_config("ppo.init_from_sft=false", f"policy.model.path={qwen3}", f"env.class={SCRIPTED}"))


def test_sft_transcripts_render_chat_observations_as_episodes_do():
    chat, tok = ChatFormat(None, (("enable_thinking", False),)), tokenizer("qwen3")

    class Env:
        def reset(self, rows, ids):
            return [{} for _ in rows]

        def step(self, states, texts, ids):
            return [(s, tool(str(len(t))), 0.0, False) for s, t in zip(states, texts)]

    problems = [Problem("Q", "<calc>2*3</calc>#### 6", "6")]
    episodes = transcript_episodes(tok, chat, Env(), ("</calc>",), problems, [0])
    turn1, observed, turn2 = (tok.decode(s.tokens) for s in episodes[0])
    assert (turn1, turn2) == ("<calc>2*3</calc>", "#### 6<|im_end|>")
    assert observed == chat.turn_text(tok, tool("16"), None)
    assert observed.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n16\n") and observed.endswith(EMPTY_THINK)
