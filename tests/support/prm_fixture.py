"""Tiny process reward models built from config: with random weights, a token-classification PRM on the character
tokenizer (1 or 2 labels) and Math-Shepherd's form, a causal LM on the Qwen-format byte-level BPE tokenizer read
at a step tag; with set weights, a PRM that scores whether a step ends in a given character."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForTokenClassification

from dtppo.config import TinyModelConfig
from dtppo.models.causal_lm import tiny_qwen2_config
from dtppo.models.tokenizer import build_char_tokenizer, load_tokenizer
from tests.support.hf_fixtures import qwen_format_dir, with_chat_template

SHAPE = TinyModelConfig(
    hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, max_position_embeddings=1024
)


def token_classification_prm(directory: Path, num_labels: int = 1, seed: int = 0) -> Path:
    """A Qwen2ForTokenClassification PRM with the character tokenizer (and its chat template)."""
    tokenizer = build_char_tokenizer()
    config = tiny_qwen2_config(SHAPE, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
    config.num_labels = num_labels
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForTokenClassification(config)
        with torch.no_grad():  # a spread of scores, not all ~0.5
            model.score.weight.mul_(20.0)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def causal_lm_prm(directory: Path, chat_template: bool = False, seed: int = 0) -> Path:
    """A Qwen2ForCausalLM PRM with a byte-level BPE tokenizer; without its chat template (Math-Shepherd's plain
    text input) unless ``chat_template``."""
    source = qwen_format_dir(directory.with_name(directory.name + "-source"), seed=seed)
    return source if chat_template else with_chat_template(source, directory, None)


def last_char_prm(directory: Path, tokenizer_dir: Path, char: str, margin: float = 4.0) -> Path:
    """A hand-set token-classification PRM on the tokenizer at ``tokenizer_dir``: its score at a token is
    sigmoid(+margin) when the token is ``char`` and sigmoid(-margin) otherwise. Its layers add nothing to the
    residual stream (zero output projections), so the final norm sees the embedding alone: ``char``'s on one axis,
    every other token's on another."""
    tokenizer = load_tokenizer(str(tokenizer_dir))
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=1,
    )
    model = Qwen2ForTokenClassification(config)
    target = tokenizer.convert_tokens_to_ids(char)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed = model.model.embed_tokens.weight
        embed.zero_()
        embed[:, 1] = 1.0
        embed[target] = torch.nn.functional.one_hot(torch.tensor(0), config.hidden_size).float()
        model.score.weight.zero_()
        model.score.weight[0, :2] = torch.tensor([margin, -margin]) / config.hidden_size**0.5
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
