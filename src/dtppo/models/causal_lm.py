"""Build the policy: an HF causal LM from a local directory or from the tiny Qwen2 config."""

from __future__ import annotations

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from dtppo.config import TinyModelConfig
from dtppo.models.attention import attention_implementation
from dtppo.models.loading import disable_dropout, loading_from


def tiny_qwen2_config(tiny: TinyModelConfig, vocab_size: int, pad_id: int, eos_id: int) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=tiny.hidden_size,
        num_hidden_layers=tiny.num_layers,
        num_attention_heads=tiny.num_heads,
        num_key_value_heads=tiny.num_kv_heads,
        intermediate_size=tiny.intermediate_size,
        max_position_embeddings=tiny.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=eos_id,
    )


def build_causal_lm(
    path: str | None, tiny: TinyModelConfig, vocab_size: int, pad_id: int, eos_id: int, seed: int
) -> PreTrainedModel:
    """fp32 causal LM from the HF directory ``path``, else a random tiny Qwen2 seeded with ``seed``; its attention
    is ``models.attention``'s choice."""
    if path is not None:
        with loading_from(path):
            config = AutoConfig.from_pretrained(path)
            return AutoModelForCausalLM.from_pretrained(
                path,
                config=config,
                dtype=torch.float32,
                attn_implementation=attention_implementation(config),
                use_safetensors=True,  # a pickled pytorch_model.bin could run code (models.loading.weights_refusal)
            )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        config = tiny_qwen2_config(tiny, vocab_size, pad_id, eos_id)
        config._attn_implementation = attention_implementation(config)
        return Qwen2ForCausalLM(config)


def build_policy(
    path: str | None, tiny: TinyModelConfig, seed: int, tokenizer: PreTrainedTokenizerBase
) -> PreTrainedModel:
    """The policy's starting weights (``path``, ``Config.policy_init_path``, or the tiny model seeded by ``seed``),
    dropout off: what the policy worker trains and every generation rank starts from, the same on every rank."""
    return disable_dropout(
        build_causal_lm(path, tiny, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, seed)
    )


def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """The tokens that end a response: the tokenizer's EOS, then each ``eos_token_id`` of the model's generation
    config (one id or a list: Qwen2.5-Instruct lists ``<|im_end|>`` and ``<|endoftext|>``, Llama 3 its
    end-of-turn tokens), as ``transformers.generate`` stops at any of them."""
    listed = model.generation_config.eos_token_id if model.generation_config is not None else None
    listed = [] if listed is None else [listed] if isinstance(listed, int) else list(listed)
    return tuple(dict.fromkeys([tokenizer.eos_token_id, *listed]))
