"""Model directories of the families users bring in 2026, each in its family's real format, small and random.

``family_dir(directory, family)`` writes a model directory for ``family`` in FAMILIES: the family's config class
and architecture features, a byte-level BPE tokenizer trained on the shipped GSM8K rows with the family's special
tokens, its chat template (tests/support/chat_templates.py) and a generation_config naming its stop tokens.

- ``qwen3``: Qwen3 (q/k norms; ``head_dim`` 32, not hidden / heads = 16), Qwen's special tokens and ``<think>``.
- ``llama3``: Llama 3.x with ``llama3`` RoPE scaling (original context 64, so positions past it are scaled), Llama
  3's header tokens, ``<|eot_id|>`` the tokenizer's EOS, and ``<|finetune_right_pad_id|>`` to pad.
- ``mistral``: Mistral with ``sliding_window: null`` (v0.3), ``[INST]`` turns, no pad token.
- ``gemma3``: Gemma 3 text with an 8-token sliding window on three of four layers (shorter than a prompt), scaled
  embeddings, q/k norms, Gemma's turn tokens; ``<end_of_turn>`` ends a response.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from tests.support.chat_templates import GEMMA3_TEMPLATE, LLAMA3_TEMPLATE, MISTRAL_TEMPLATE, QWEN3_TEMPLATE
from tests.support.hf_fixtures import QWEN_SPLIT, _byte_level_bpe, _save

FAMILIES = ("qwen3", "llama3", "mistral", "gemma3")
WINDOW = 8  # gemma3's sliding window, in tokens
_SHAPE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)

# family -> (special tokens, tokenizer's bos / eos / pad, extra stop tokens of generation_config, template)
_TOKENS = {
    "qwen3": (
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"],
        (None, "<|im_end|>", "<|endoftext|>"),
        ["<|endoftext|>"],
        QWEN3_TEMPLATE,
    ),
    "llama3": (
        [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|finetune_right_pad_id|>",
        ],
        ("<|begin_of_text|>", "<|eot_id|>", "<|finetune_right_pad_id|>"),
        ["<|end_of_text|>", "<|eom_id|>"],
        LLAMA3_TEMPLATE,
    ),
    "mistral": (["<unk>", "<s>", "</s>", "[INST]", "[/INST]"], ("<s>", "</s>", None), [], MISTRAL_TEMPLATE),
    "gemma3": (
        ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
        ("<bos>", "<eos>", "<pad>"),
        ["<end_of_turn>"],
        GEMMA3_TEMPLATE,
    ),
}


def _tokenizer(family: str, vocab_size: int) -> PreTrainedTokenizerFast:
    special, (bos, eos, pad), _, template = _TOKENS[family]
    core = _byte_level_bpe(vocab_size, special, QWEN_SPLIT if family == "qwen3" else None)
    named = {"bos_token": bos, "eos_token": eos, "pad_token": pad}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        **{k: v for k, v in named.items() if v is not None},
        additional_special_tokens=[t for t in special if t not in named.values()],
        model_max_length=32768,
    )
    tokenizer.chat_template = template
    return tokenizer


def _model(family: str, vocab_size: int, ids: dict[str, int | None]):
    common = dict(_SHAPE, vocab_size=vocab_size, max_position_embeddings=1024, **ids)
    if family == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=2, head_dim=32, tie_word_embeddings=True, **common))
    if family == "llama3":
        rope = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
        rope["original_max_position_embeddings"] = 64
        return LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, rope_parameters=rope, **common))
    if family == "mistral":
        return MistralForCausalLM(MistralConfig(num_hidden_layers=2, sliding_window=None, **common))
    layers = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]
    config = Gemma3TextConfig(num_hidden_layers=4, head_dim=16, sliding_window=WINDOW, layer_types=layers, **common)
    return Gemma3ForCausalLM(config)


def family_dir(directory: Path, family: str, vocab_size: int = 600, seed: int = 0) -> Path:
    """A model directory of ``family`` (FAMILIES) with random weights seeded with ``seed``."""
    tokenizer = _tokenizer(family, vocab_size)
    _, _, stops, _ = _TOKENS[family]
    bos, eos, pad = (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = _model(family, len(tokenizer), {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad})
    stop_ids = [eos, *tokenizer.convert_tokens_to_ids(stops)]
    generation = GenerationConfig(bos_token_id=bos, eos_token_id=stop_ids, pad_token_id=pad)
    return _save(directory, model, tokenizer, generation)
