"""``data.chat_template_kwargs``: a frozen mapping of names to JSON scalars, refused with its key otherwise, that
reaches every rendering of the policy's chat template (prompts, SFT rows, validation, the observation turns of
episodes, preflight's check) through one call (``data.chat.ChatFormat.render``). Qwen3's ``enable_thinking: false``
closes an empty think block in the generation prompt, which each path's output shows (and without the key, not)."""

from __future__ import annotations

import functools
import re

import pytest
import torch

from dtppo.config import ConfigError, from_dict
from dtppo.data.chat import ChatFormat, encode_prompts
from dtppo.data.problem import Problem
from dtppo.generation.episodes import with_episodes
from dtppo.generation.responses import sample_responses
from dtppo.launch.preflight import preflight
from dtppo.sft.trainer import sft_batch
from dtppo.types import SampleRequest, SamplingParams, Segment, build_episode_rows
from tests.support import chat_templates as ct
from tests.support.hf_fixtures import QWEN_TEMPLATE, with_chat_template
from tests.support.recipes import REPO, tiny_config

EMPTY_THINK = "<think>\n\n</think>\n\n"
NO_THINKING = "data.chat_template_kwargs.enable_thinking=false"
TOOL_ENV = f"{REPO / 'tests' / 'support' / 'chat_env.py'}:ToolMessages"
PROBLEMS = [Problem("What is 2 + 3?", "#### 5", "5"), Problem("What is 4 * 4?", "#### 16", "16")]


@functools.cache
def qwen3():
    return ct.chat_tokenizer(ct.QWEN3)


def test_the_key_is_a_frozen_mapping_from_a_recipe_or_the_command_line():
    for override in (NO_THINKING, "data.chat_template_kwargs={enable_thinking: false, date_string: 26 Jul 2024}"):
        cfg = tiny_config(override)
        assert dict(cfg.data.chat_template_kwargs)["enable_thinking"] is False
        assert hash(cfg.data) == hash(from_dict(cfg.to_dict()).data) and from_dict(cfg.to_dict()) == cfg
    assert tiny_config().data.chat_template_kwargs == ()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"enable_thinking": [False]}, r"data\.chat_template_kwargs\.enable_thinking: expected a string, number"),
        ({"enable_thinking": {"on": False}}, r"data\.chat_template_kwargs\.enable_thinking: expected"),
        ({"temperature": float("nan")}, r"data\.chat_template_kwargs\.temperature: expected .* got nan"),
        ({"add_generation_prompt": True}, r"data\.chat_template_kwargs\.add_generation_prompt: is set on every"),
        ({"eos_token": "</s>"}, r"data\.chat_template_kwargs\.eos_token: is set on every"),
        ({"not a name": 1}, r"data\.chat_template_kwargs: 'not a name' is not a keyword argument name"),
        ("enable_thinking", r"data\.chat_template_kwargs: expected a mapping of names to values"),
    ],
)
def test_a_value_that_is_not_a_mapping_of_names_to_json_scalars_is_refused_naming_the_key(value, message):
    with pytest.raises(ConfigError, match=rf"^{message}"):
        from_dict({"data": {"chat_template_kwargs": value}})


class Recording:
    """A ``Generator`` that records its prompts and answers each turn with "A" and the tokenizer's EOS."""

    def __init__(self, tok):
        self.tok, self.prompts = tok, []

    def sample(self, request):
        self.prompts += [self.tok.decode(p) for p in request.prompts]
        ids = self.tok("A", add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        segments = [[Segment(ids, 1, [0.0] * len(ids))] for _ in request.prompts]
        return build_episode_rows(request.prompts, segments, [0] * len(request.prompts), self.tok.pad_token_id)

    def close(self):
        pass


@pytest.mark.parametrize("thinking", [False, None])
def test_the_variables_reach_prompts_validation_sft_rows_and_episodes(thinking):
    env = [f"env.class={TOOL_ENV}", "env.num_workers=0", "env.max_turns=3"]
    cfg = tiny_config(*([NO_THINKING] if thinking is False else []), *env)
    tok, closed = qwen3(), thinking is False  # None: the key unset, the negative control
    prompts = [tok.decode(p) for p in encode_prompts(tok, PROBLEMS, cfg.data)]
    assert all(p.endswith("<|im_start|>assistant\n" + EMPTY_THINK * closed) for p in prompts)
    validation = Recording(tok)
    sample_responses(validation, tok, PROBLEMS, cfg.policy.generation, cfg.ppo.validation, cfg.data, 0, step=0)
    assert validation.prompts == prompts
    rows = sft_batch(tok, PROBLEMS, tiny_config(*([NO_THINKING] if closed else [])))
    assert tok.decode(rows.input_ids[0]).startswith(prompts[0] + "#### 5<|im_end|>")
    episodes = with_episodes(Recording(tok), cfg.env, ChatFormat.of(cfg.data), tok)
    row = episodes.sample(SampleRequest([tok(prompts[0])["input_ids"]], SamplingParams(8), 0, torch.arange(1), [{}]))
    text = tok.decode(row.input_ids[0, : int(row.attention_mask[0].sum())])
    after = "<|im_start|>assistant\n" + EMPTY_THINK * closed + "A<|im_end|>"
    assert text.count(after) == 3 and text.count("<tool_response>\n14\n</tool_response>") == 1


def test_preflight_renders_with_the_variables_and_refuses_a_name_the_template_does_not_read(qwen_dir, tmp_path):
    model = with_chat_template(qwen_dir, tmp_path / "qwen3", ct.QWEN3_TEMPLATE)
    base = ["ppo.init_from_sft=false", f"policy.model.path={model}"]
    preflight(tiny_config(*base, NO_THINKING, f"env.class={TOOL_ENV}"))
    with pytest.raises(
        ConfigError,
        match=r"^data\.chat_template_kwargs\.enable_thinkng: the chat template of .*qwen3 does not read it "
        r"\(the variables that change what it renders: enable_thinking\): remove it, or correct its name$",
    ):
        preflight(tiny_config(*base, "data.chat_template_kwargs.enable_thinkng=false"))
    # Negative control: Qwen2.5's template has no enable_thinking to read.
    with pytest.raises(
        ConfigError,
        match=r"^data\.chat_template_kwargs\.enable_thinking: the chat template of .* does not read it \(the "
        r"variables that change what it renders: none\)",
    ):
        preflight(tiny_config(base[0], f"policy.model.path={qwen_dir}", NO_THINKING))


@pytest.mark.parametrize("name", ["content", "reasoning_content"])
def test_a_variable_the_template_reads_but_that_changes_nothing_is_refused(qwen_dir, tmp_path, name):
    # Qwen3's template reads `content` and `reasoning_content` only after setting them itself from each message
    model = with_chat_template(qwen_dir, tmp_path / "qwen3", ct.QWEN3_TEMPLATE)
    base = ["ppo.init_from_sft=false", f"policy.model.path={model}"]
    with pytest.raises(ConfigError) as refused:
        preflight(tiny_config(*base, f"data.chat_template_kwargs.{name}=x"))
    assert str(refused.value) == (
        f"data.chat_template_kwargs.{name}: the chat template of {model} renders the same text with it as without it "
        "(the variables that change what it renders: enable_thinking): remove it, or correct its name"
    )
    # Negative control: a variable that changes the prompt passes, with either value (true renders as its absence
    # does, the template's default, and still names a real variable: false changes the prompt)
    for value in ("false", "true"):
        preflight(tiny_config(*base, f"data.chat_template_kwargs.enable_thinking={value}"))


def test_each_familys_own_variable_passes_and_one_that_changes_nothing_is_refused(qwen_dir, tmp_path):
    # Llama 3.2's template reads date_string (the system header's date) and tools_in_user_message, which changes
    # only where tools are given: dtppo never gives any, so it changes nothing dtppo renders
    model = with_chat_template(qwen_dir, tmp_path / "llama3", ct.LLAMA3_TEMPLATE)
    base = ["ppo.init_from_sft=false", f"policy.model.path={model}"]
    preflight(tiny_config(*base, "data.chat_template_kwargs.date_string=26 Jul 2024"))
    with pytest.raises(
        ConfigError,
        match=r"^data\.chat_template_kwargs\.tools_in_user_message: the chat template of .*llama3 renders the same "
        r"text with it as without it \(the variables that change what it renders: custom_tools, date_string\)",
    ):
        preflight(tiny_config(*base, "data.chat_template_kwargs.tools_in_user_message=false"))


def test_a_variable_is_tried_with_its_own_value_too(qwen_dir, tmp_path):
    # A template that tests for one value, which none of the values every variable is tried with equals
    model = with_chat_template(
        qwen_dir, tmp_path / "styled", "{% if style == 'terse' %}Be terse.{% endif %}" + QWEN_TEMPLATE
    )
    base = ["ppo.init_from_sft=false", f"policy.model.path={model}"]
    preflight(tiny_config(*base, "data.chat_template_kwargs.style=terse"))
    # Negative control: with another value it renders as without it
    with pytest.raises(ConfigError, match=r"^data\.chat_template_kwargs\.style: .* renders the same text with it as"):
        preflight(tiny_config(*base, "data.chat_template_kwargs.style=chatty"))


def test_one_call_renders_the_policys_chat_template():
    calls = {
        str(path.relative_to(REPO)): len(re.findall(r"\.apply_chat_template\(", path.read_text()))
        for path in (REPO / "src" / "dtppo").rglob("*.py")
    }
    # data/chat.py: the policy's template, every rendering; rewards/model.py: a reward model's (or a PRM's) own.
    assert {path: n for path, n in calls.items() if n} == {"src/dtppo/data/chat.py": 1, "src/dtppo/rewards/model.py": 1}
