"""Model shapes, and model directories for the GPU throughput table: Qwen2.5's transformer shapes with its
151,936-entry vocabulary, random weights, and a tokenizer that only has to encode the tiny-math prompts and decode
whatever the random model samples (rewards do not matter for throughput).

The tokenizer is the project's character tokenizer (prompts encode as characters) padded with filler tokens
``<f0>``, ``<f1>``, ... up to the vocabulary size: every id the model can sample decodes. No download.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from dtppo.models.tokenizer import CHAR_CHAT_TEMPLATE, EOS, PAD, UNK, build_char_tokenizer

# Qwen2.5-0.5B's and -1.5B's transformer shapes (config.json of the hub models; both tie the embedding and the LM
# head), and a smoke shape for the CPU fallbacks.
FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size")
SIZES = {"0.5b": (896, 24, 14, 2, 4864), "1.5b": (1536, 28, 12, 2, 8960), "smoke": (64, 2, 4, 2, 128)}
SHAPES = {name: dict(zip(FIELDS, sizes)) for name, sizes in SIZES.items()}
QWEN25_VOCAB = 151936
QWEN_05B = SHAPES["0.5b"] | {"vocab_size": QWEN25_VOCAB, "tie_word_embeddings": True}  # the hub model's config


def padded_char_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """The character tokenizer with filler tokens up to ``vocab_size`` ids."""
    base = build_char_tokenizer()
    vocab = dict(base.get_vocab())
    vocab |= {f"<f{i}>": i for i in range(len(vocab), vocab_size)}
    core = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    core.pre_tokenizer = base.backend_tokenizer.pre_tokenizer
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token=UNK)
    tok.chat_template = CHAR_CHAT_TEMPLATE
    return tok


def write_model_dir(path: Path, shape: str, vocab_size: int, device: torch.device) -> dict:
    """A Qwen2 model directory at ``path``: config, random bf16 weights (safetensors) and the padded tokenizer.
    Returns the shape as ``bench/common/workload.py`` names its fields."""
    tok = padded_char_tokenizer(vocab_size)
    dims = SHAPES[shape]
    config = Qwen2Config(
        **dims,
        vocab_size=vocab_size,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    del model
    return {
        "hidden_size": dims["hidden_size"],
        "num_layers": dims["num_hidden_layers"],
        "num_heads": dims["num_attention_heads"],
        "num_kv_heads": dims["num_key_value_heads"],
        "intermediate_size": dims["intermediate_size"],
    }
