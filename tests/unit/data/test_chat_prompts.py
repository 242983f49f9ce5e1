"""Prompts through the chat template (``dtppo.data.chat``): a text prompt is the user turn after the run's system
prompt, chat-message rows keep their own system turn, and a prompt's length is counted in the template's tokens,
as the length rule (``data.max_prompt_tokens``) and ``encode_prompts`` count it."""

from __future__ import annotations

from dtppo.config import DataConfig
from dtppo.data.chat import ChatFormat, conversation, encode_prompts, format_prompt, prompt_length
from dtppo.data.loader import build_sources
from dtppo.data.problem import Problem
from dtppo.models.tokenizer import load_tokenizer
from tests.support.custom_rows import MESSAGES, custom_config, write_rows


def test_a_text_prompt_is_the_user_turn_after_the_system_prompt():
    assert conversation("Q", None) == [{"role": "user", "content": "Q"}]
    assert conversation("Q", "S") == [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    assert conversation(MESSAGES, "Ignored") == MESSAGES  # the row's own system turn wins


def test_chat_prompts_go_through_the_template_and_the_length_rule(tmp_path):
    tokenizer = load_tokenizer(None)
    user_only = [{"role": "user", "content": "Say 7."}]
    sys, ignored = ChatFormat("Sys"), ChatFormat("Ignored")
    assert format_prompt(tokenizer, user_only, sys) == format_prompt(tokenizer, "Say 7.", sys)
    assert format_prompt(tokenizer, MESSAGES, ignored) == "Be brief.\nSay 7.\nAnswer: "  # the row's own system turn
    path = write_rows(
        tmp_path / "rows.jsonl", [{"prompt": MESSAGES}, {"prompt": [{"role": "user", "content": "x" * 300}]}]
    )
    cfg = custom_config(path, "data.max_prompt_tokens=100")
    train, validation = build_sources(cfg.data, cfg.ppo.seed, cfg.ppo.validation.max_samples, tokenizer=tokenizer)
    assert [p.question for p in train] == [MESSAGES] and validation == train
    assert encode_prompts(tokenizer, train, cfg.data)[0] == tokenizer("Be brief.\nSay 7.\nAnswer: ")["input_ids"]


def test_the_length_of_a_prompt_is_its_encoded_length_and_encoding_keeps_the_last_tokens():
    tokenizer = load_tokenizer(None)
    length = prompt_length(tokenizer, ChatFormat("Sys"))
    assert length("Say 7.") == len("Sys\nSay 7.\nAnswer: ")  # one token per character
    data = DataConfig(system_prompt="Sys", max_prompt_tokens=5)
    (ids,) = encode_prompts(tokenizer, [Problem("Say 7.", "", None)], data)
    assert tokenizer.decode(ids) == "wer: "  # a prompt over the limit keeps its end, where the question is asked
