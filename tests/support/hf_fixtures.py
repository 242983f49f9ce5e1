"""HF model directories in the real formats, built from the shared GSM8K text (no download), random small weights.

- ``qwen_format_dir``: Qwen2.5-Instruct's layout. A byte-level BPE tokenizer with Qwen's pre-tokenizer split (digits
  one by one) and special tokens (``<|endoftext|>`` pads, ``<|im_end|>`` is the tokenizer's EOS), Qwen's chat
  template (default system turn), a generation_config listing both as stop tokens (as Qwen2.5-Instruct's does),
  tied embeddings and 1 kv head (Qwen2.5-0.5B/1.5B's ratio: 2 query heads per kv head here).
- ``llama_format_dir``: Llama 2's layout. A Metaspace (▁) BPE tokenizer with ``<s>``/``</s>``/``<unk>`` and no pad
  token, an ``[INST]`` chat template with a ``<<SYS>>`` block, untied embeddings, one stop token.
- ``gpt2_format_dir``: a GPT-2 model (``transformer.h`` blocks, Conv1D projections) with a byte-level tokenizer.
- ``with_chat_template``, ``without_tokenizer``, ``with_pickled_weights``: a copy of one of them with another chat
  template, with no tokenizer files, or with its weights in a pickle that runs code when it is unpickled.

The Qwen-format model is nudged so that ``<|endoftext|>`` (a stop token listed only in generation_config) is
likely: every token embedding carries a constant in one hidden dimension, and ``<|endoftext|>``'s carries more,
so its logit leads at every position. Sampled responses (T = 1) end after ~7 tokens on it; greedy ones
at once. With only the tokenizer's EOS as a stop, nearly every response would run to max_new_tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    GenerationConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

# The first GSM8K rows, shipped with the tests (tests/data/gsm8k, MIT, its LICENSE beside it).
GSM8K = Path(__file__).resolve().parents[1] / "data" / "gsm8k"
GSM8K_TRAIN = GSM8K / "train.jsonl"
GSM8K_TEST = GSM8K / "test.jsonl"

QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA_SPECIAL = ["<unk>", "<s>", "</s>"]
LLAMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{% set system = '<<SYS>>\\n' + messages[0]['content'] + '\\n<</SYS>>\\n\\n' %}{% set rest = messages[1:] %}"
    "{% else %}{% set system = '' %}{% set rest = messages %}{% endif %}"
    "{% for message in rest %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + (system if loop.first else '') + message['content'] + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] + ' ' + eos_token }}{% endif %}{% endfor %}"
)
# A template that, like Mistral's and Gemma's, refuses a system turn.
NO_SYSTEM_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def gsm8k_text(rows: int = 1500) -> list[str]:
    """Questions and worked answers of the first ``rows`` GSM8K training rows."""
    texts = []
    with GSM8K_TRAIN.open() as fh:
        for _, line in zip(range(rows), fh):
            row = json.loads(line)
            texts += [row["question"], row["answer"]]
    return texts


def _byte_level_bpe(vocab_size: int, special: list[str], split: str | None) -> Tokenizer:
    core = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split is None)
    core.pre_tokenizer = (
        byte_level
        if split is None
        else pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"), byte_level])
    )
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(gsm8k_text(), trainer)
    return core


def _save(directory: Path, model, tokenizer: PreTrainedTokenizerFast, generation: GenerationConfig) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    model.generation_config = generation
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def qwen_format_dir(directory: Path, vocab_size: int = 800, seed: int = 0) -> Path:
    core = _byte_level_bpe(vocab_size, QWEN_SPECIAL, QWEN_SPLIT)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        model_max_length=32768,
    )
    tokenizer.chat_template = QWEN_TEMPLATE
    endoftext, im_end = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=im_end,
        pad_token_id=endoftext,
    )
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        embed = model.model.embed_tokens.weight
        embed[:, 0] = 0.5  # the residual stream's dimension 0 is ~0.5 after every token ...
        embed[endoftext, 0] = 1.2  # ... so <|endoftext|>'s logit leads by several nats at every position
    generation = GenerationConfig(bos_token_id=endoftext, eos_token_id=[im_end, endoftext], pad_token_id=endoftext)
    return _save(directory, model, tokenizer, generation)


def llama_format_dir(directory: Path, vocab_size: int = 600, seed: int = 0) -> Path:
    core = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    core.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    core.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(content=" ", left=1, right=0),
        ]
    )
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=LLAMA_SPECIAL, show_progress=False)
    core.train_from_iterator(gsm8k_text(), trainer)
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", core.token_to_id("<s>"))]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>", model_max_length=4096
    )
    tokenizer.chat_template = LLAMA_TEMPLATE
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=None,
    )
    generation = GenerationConfig(bos_token_id=bos, eos_token_id=eos)
    return _save(directory, LlamaForCausalLM(config), tokenizer, generation)


def gpt2_format_dir(directory: Path, vocab_size: int = 600, seed: int = 0) -> Path:
    core = _byte_level_bpe(vocab_size, ["<|endoftext|>"], None)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<|endoftext|>", eos_token="<|endoftext|>", model_max_length=1024
    )
    tokenizer.chat_template = QWEN_TEMPLATE
    eos = tokenizer.eos_token_id
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tokenizer), n_embd=64, n_layer=2, n_head=2, n_positions=1024, bos_token_id=eos, eos_token_id=eos
    )
    return _save(directory, GPT2LMHeadModel(config), tokenizer, GenerationConfig(bos_token_id=eos, eos_token_id=eos))


class CodeOnUnpickling:
    """Unpickling this calls ``open(marker, "w")``: it creates ``marker``, the evidence that code ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _copy(source: Path, directory: Path, keep) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        if file.is_file() and keep(file.name):
            (directory / file.name).write_bytes(file.read_bytes())
    return directory


def with_pickled_weights(source: Path, directory: Path, marker: Path) -> Path:
    """A copy of model directory ``source`` whose weights are a ``pytorch_model.bin`` (no safetensors), as older hub
    models ship them, holding an object whose unpickling creates ``marker``."""
    _copy(source, directory, lambda name: not name.endswith(".safetensors"))
    torch.save({"lm_head.weight": CodeOnUnpickling(marker)}, directory / "pytorch_model.bin")
    return directory


def without_tokenizer(source: Path, directory: Path, template: str | None = None) -> Path:
    """A copy of model directory ``source`` with its config and weights only, as ``model.save_pretrained`` alone
    leaves a fine-tuned model; ``template``: then a tokenizer_config.json holding only that chat template."""
    _copy(source, directory, lambda name: name in {"config.json", "generation_config.json", "model.safetensors"})
    if template is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return directory


def with_chat_template(source: Path, directory: Path, template: str | None) -> Path:
    """A copy of model directory ``source`` whose tokenizer has ``template`` (None: no chat template at all)."""
    _copy(source, directory, lambda name: name != "chat_template.jinja")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    if template is not None:
        config["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory
