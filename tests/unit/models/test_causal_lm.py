"""Building the policy (``dtppo.models.causal_lm``): the tiny Qwen2's config from its shape and the tokenizer's ids,
a seeded build that is the same every time and leaves the global RNG alone, dropout off, and the tokens that end a
response (the tokenizer's EOS, then the generation config's, once each)."""

import torch
from transformers import GenerationConfig

from dtppo.config import TinyModelConfig
from dtppo.models.causal_lm import build_causal_lm, build_policy, stop_token_ids, tiny_qwen2_config
from dtppo.models.tokenizer import build_char_tokenizer

TINY = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)


def test_the_tiny_config_is_the_shape_with_the_tokenizers_ids_and_a_tied_head():
    config = tiny_qwen2_config(TINY, 99, 0, 1)
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (99, 32, 2)
    assert (config.num_attention_heads, config.num_key_value_heads, config.intermediate_size) == (4, 2, 64)
    assert (config.pad_token_id, config.eos_token_id, config.bos_token_id) == (0, 1, 1)
    assert config.tie_word_embeddings and config.max_position_embeddings == TINY.max_position_embeddings


def test_a_seeded_build_is_the_same_every_time_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b = build_causal_lm(None, TINY, 40, 0, 1, seed=7), build_causal_lm(None, TINY, 40, 0, 1, seed=7)
    assert torch.equal(torch.get_rng_state(), before)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    c = build_causal_lm(None, TINY, 40, 0, 1, seed=8)
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    assert next(a.parameters()).dtype == torch.float32


def test_the_policy_has_the_tokenizers_vocabulary_and_no_dropout():
    tok = build_char_tokenizer()
    policy = build_policy(None, TINY, 0, tok)
    assert policy.config.vocab_size == len(tok) and policy.config.eos_token_id == tok.eos_token_id
    assert all(getattr(m, "attention_dropout", 0.0) == 0.0 for m in policy.modules())


def test_a_response_ends_at_the_tokenizers_eos_and_each_generation_config_eos_once():
    tok = build_char_tokenizer()
    model = build_causal_lm(None, TINY, len(tok), 0, tok.eos_token_id, seed=0)
    model.generation_config = GenerationConfig(eos_token_id=[5, tok.eos_token_id, 7])
    assert stop_token_ids(model, tok) == (tok.eos_token_id, 5, 7)
    model.generation_config = GenerationConfig(eos_token_id=9)
    assert stop_token_ids(model, tok) == (tok.eos_token_id, 9)
    model.generation_config = None
    assert stop_token_ids(model, tok) == (tok.eos_token_id,)
