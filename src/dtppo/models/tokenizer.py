"""A character-level tokenizer defined by the project, saved and loaded in HF format.

Tiny models need no download: every printable ASCII character and newline is one token, plus PAD, EOS and
UNK. It is a real ``PreTrainedTokenizerFast`` with a chat template, so the rest of dtppo treats it exactly
like a hub tokenizer (Qwen's) loaded from a directory.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from dtppo.errors import InputError
from dtppo.models.loading import loading_from

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"

# The files a tokenizer's vocabulary is read from: fast (tokenizer.json), SentencePiece (tokenizer.model, spiece.model,
# Mistral's tokenizer.model.v3), byte-level BPE (vocab.json with merges.txt), WordPiece (vocab.txt), tiktoken, Mistral's
# tekken.json. With none, AutoTokenizer builds an empty tokenizer from config.json alone (Qwen's, GPT-2's: every text
# encodes to no tokens) or fails with a message that names no file (Llama's, Mistral's).
_VOCABULARY_FILES = ("tokenizer.json", "*.model", "tokenizer.model.*", "vocab.*", "*.tiktoken", "tekken.json")

# The tiny tasks' prompt format: an optional system line, the question, then "\nAnswer: ".
CHAR_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'system' %}{{ '\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '\\nAnswer: ' }}{% endif %}"
)


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    vocab = {PAD: 0, EOS: 1, UNK: 2} | {ch: i + 3 for i, ch in enumerate(chars)}
    core = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token=UNK)
    tok.chat_template = CHAR_CHAT_TEMPLATE
    tok.padding_side = "right"
    return tok


def load_tokenizer(path: str | None) -> PreTrainedTokenizerBase:
    """The tokenizer of ``path`` (an HF model directory or hub name), or the character tokenizer when None. A
    directory without tokenizer files (``_VOCABULARY_FILES``) is an InputError naming it.

    A directory's ``tokenizer.json`` is loaded verbatim: ``AutoTokenizer`` would pick a tokenizer class from
    the model type (Qwen2's for our tiny models) and rebuild its pre-tokenizer, dropping our characters.
    """
    if path is None:
        return build_char_tokenizer()
    directory = Path(path)
    if directory.is_dir() and not any(any(directory.glob(files)) for files in _VOCABULARY_FILES):
        raise InputError(
            f"{path} holds no tokenizer (none of tokenizer.json, tokenizer.model, vocab.json + merges.txt, "
            "vocab.txt; tokenizer_config.json alone has no vocabulary), so every prompt would encode to no tokens: "
            "copy the tokenizer files of the model it was trained from into it"
        )
    with loading_from(path):
        if (directory / "tokenizer.json").is_file():
            tok = PreTrainedTokenizerFast.from_pretrained(path)
        else:
            tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok
