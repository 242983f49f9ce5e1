"""The character tokenizer and loading tokenizers (``dtppo.models.tokenizer``): one token per printable character and
newline, round trips through a model directory unchanged, its chat template is the tiny tasks' prompt format, and a
model directory without vocabulary files is refused naming it (it would encode every prompt to nothing)."""

import pytest

from dtppo.config import TinyModelConfig
from dtppo.errors import InputError
from dtppo.models.causal_lm import build_causal_lm
from dtppo.models.tokenizer import EOS, PAD, UNK, build_char_tokenizer, load_tokenizer

TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64)


def test_every_printable_character_and_newline_is_one_token():
    tok = build_char_tokenizer()
    text = "".join(chr(c) for c in range(32, 127)) + "\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) == len(set(ids)) and min(ids) == 3
    assert tok.decode(ids) == text
    assert (tok.pad_token, tok.eos_token, tok.unk_token) == (PAD, EOS, UNK)
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2) and len(tok) == 3 + 96
    assert tok("é", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]
    assert tok.padding_side == "right"


def test_the_chat_template_is_the_tiny_tasks_prompt_format():
    tok = build_char_tokenizer()
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q?"}]
    assert tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == "S\nQ?\nAnswer: "
    assert tok.apply_chat_template(messages[1:], add_generation_prompt=False, tokenize=False) == "Q?"


def test_char_tokenizer_round_trips_through_a_model_directory(tmp_path):
    tok = build_char_tokenizer()
    # a Qwen2 config.json beside the tokenizer must not change how it tokenizes
    build_causal_lm(None, TINY, 40, 0, 1, seed=0).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded = load_tokenizer(str(tmp_path))
    text = "Tom has 3 apples.\n12 + 7 = 19\n#### 19"
    assert loaded(text, add_special_tokens=False).input_ids == tok(text, add_special_tokens=False).input_ids
    assert loaded.decode(tok(text).input_ids) == text
    messages = [{"role": "user", "content": "Q?"}]
    assert loaded.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == "Q?\nAnswer: "
    assert (loaded.eos_token_id, loaded.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)


def test_no_path_is_the_character_tokenizer_and_a_directory_without_vocabulary_is_refused(tmp_path):
    assert load_tokenizer(None).get_vocab() == build_char_tokenizer().get_vocab()
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(InputError, match=rf"{tmp_path} holds no tokenizer .*tokenizer_config.json alone"):
        load_tokenizer(str(tmp_path))
