"""Step rewards onto tokens (``dtppo.generation.step_placement``): a step ending at character ``end`` of a decoded
response lands on the token holding character ``end − 1``, checked against decoding every prefix, over random texts
and tokenizers: the character tokenizer, byte-level BPEs with multi-character tokens (and characters split over byte
tokens), a SentencePiece-style tokenizer whose lone tokens decode without their leading space; measured while the
scores are awaited or after, the same placement."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from dtppo.generation.responses import decode_tokens, response_tokens
from dtppo.generation.step_placement import StepPlacer, char_ends
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.types import Experience
from tests.support.chat_templates import QWEN25, chat_tokenizer

ALPHABET = "abcdefghij 0123456789+-*/=<>\n#.,"
UNICODE = "é€×÷−"


def _metaspace_tokenizer() -> PreTrainedTokenizerFast:
    words = ["▁" + w for w in ("a", "b", "ab", "12", "3", "=", "+")] + list("ab123=+") + ["▁"]
    vocab = {"<unk>": 0, "</s>": 1, **{w: i + 2 for i, w in enumerate(dict.fromkeys(words))}}
    core = Tokenizer(models.WordPiece(vocab, unk_token="<unk>", max_input_chars_per_word=100))
    core.pre_tokenizer = pre_tokenizers.Metaspace()
    core.decoder = decoders.Metaspace()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="</s>")


TOKENIZERS = {
    "char": build_char_tokenizer,
    "byte_bpe": lambda: chat_tokenizer(QWEN25),
    "metaspace": _metaspace_tokenizer,
}


def _ends(tokenizer, ids: list[int], text: str) -> list[int]:
    """Where each of ``ids`` ends in ``text``."""
    return char_ends(tokenizer, np.array(ids), np.array([len(ids)]), [text], [0, len(text)])[1:].tolist()


def _placed(tokenizer, experience: Experience, steps: list, texts: list[str] | None = None, prepared: bool = False):
    tokens = response_tokens(experience)
    placer = StepPlacer(tokenizer, tokens, texts if texts is not None else decode_tokens(tokenizer, tokens))
    if prepared:
        placer.prepare()
    return placer.place(steps)


def _brute_force_token(tokenizer, ids: list[int], end: int) -> int:
    """The first token after which the decoded prefix holds character ``end − 1``."""
    for k in range(len(ids)):
        if len(tokenizer.decode(ids[: k + 1], skip_special_tokens=True)) >= end:
            return k
    raise AssertionError("end beyond the text")


def _experience(rows: list[list[int]], prompt: int, pad: int) -> Experience:
    width = prompt + max(len(r) for r in rows) + 2
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width)
    for b, row in enumerate(rows):
        ids[b, prompt : prompt + len(row)] = torch.tensor(row)
        mask[b, prompt : prompt + len(row)] = 1.0
    zeros = torch.zeros(len(rows), width)
    return Experience(ids, (mask > 0).long(), mask, zeros, torch.zeros(len(rows), dtype=torch.bool))


def _random_text(rng: random.Random, unicode: bool, length: int) -> str:
    alphabet = ALPHABET + (UNICODE if unicode else "")
    return "".join(rng.choice(alphabet) for _ in range(length))


@pytest.mark.parametrize("prepared", [False, True], ids=["measured_after", "prepared_while_scoring"])
@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_each_step_lands_on_the_token_holding_its_last_character(name, prepared):
    tokenizer, rng = TOKENIZERS[name](), random.Random(0)
    vocabulary = set(tokenizer.get_vocab())
    rows, steps, expected = [], [], []
    for _ in range(40):
        text = _random_text(rng, unicode=name == "byte_bpe", length=rng.randint(1, 60))
        if name == "metaspace":
            text = " ".join(rng.choice(["a", "b", "ab", "12", "3", "=", "+"]) for _ in range(rng.randint(1, 12)))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if rng.random() < 0.5 and tokenizer.eos_token_id is not None:
            ids = ids + [tokenizer.eos_token_id]  # a stop token: dropped from the text, never a step's token
        decoded = tokenizer.decode(ids, skip_special_tokens=True)
        if not decoded:
            continue
        ends = sorted(rng.sample(range(1, len(decoded) + 1), k=min(4, len(decoded))))
        rows.append(ids)
        steps.append(tuple((e, float(e)) for e in ends))
        expected.append([_brute_force_token(tokenizer, ids, e) for e in ends])
    assert vocabulary and len(rows) > 20
    experience = _experience(rows, prompt=3, pad=tokenizer.pad_token_id or 0)
    rewards, marks = _placed(tokenizer, experience, steps, prepared=prepared)
    for b, (tokens, row_steps) in enumerate(zip(expected, steps)):
        want = torch.zeros(rewards.shape[1])
        for token, (_, reward) in zip(tokens, row_steps):
            want[3 + token] += reward  # steps on one token add up
        assert torch.equal(rewards[b], want), (b, tokenizer.decode(rows[b]), row_steps)
        assert torch.equal(marks[b], (want != 0).float())


def test_a_step_ending_inside_a_multi_character_token_lands_on_it():
    tokenizer = chat_tokenizer(QWEN25)
    ids = tokenizer("Janet sells 16 eggs", add_special_tokens=False)["input_ids"]
    ends = _ends(tokenizer, ids, tokenizer.decode(ids))
    wide = next(k for k in range(len(ids)) if ends[k] - (ends[k - 1] if k else 0) >= 3)
    inside = int(ends[wide]) - 1  # the token's second-to-last character
    experience = _experience([ids], 0, 0)
    rewards, _ = _placed(tokenizer, experience, [((inside, 1.0),)])
    assert rewards[0].nonzero().squeeze(1).tolist() == [wide]


def test_token_ends_take_the_fast_path_only_when_the_pieces_make_the_text():
    char, metaspace = build_char_tokenizer(), _metaspace_tokenizer()
    ids = char("ab=3", add_special_tokens=False)["input_ids"]
    assert _ends(char, ids, "ab=3") == [1, 2, 3, 4]
    ids = metaspace("ab 12 = 3", add_special_tokens=False)["input_ids"]
    text = metaspace.decode(ids)
    assert "".join(metaspace.batch_decode([[t] for t in ids])) != text  # lone tokens lose their leading space
    exact = [len(metaspace.decode(ids[: k + 1])) for k in range(len(ids))]
    assert _ends(metaspace, ids, text) == exact
    # a batch: an empty row, a row whose pieces make its text, one measured exactly: offsets run on across rows
    rows = [[], metaspace("ab", add_special_tokens=False)["input_ids"], ids]
    texts = [metaspace.decode(r) for r in rows]
    assert texts[1] == "".join(metaspace.batch_decode([[t] for t in rows[1]]))
    flat, counts = np.array(rows[1] + rows[2]), np.array([len(r) for r in rows])
    starts = [0, 0, len(texts[1]), len(texts[1]) + len(text)]
    want = [0, *[len(metaspace.decode(rows[1][: k + 1])) for k in range(len(rows[1]))]]
    want += [want[-1] + e for e in exact]
    assert char_ends(metaspace, flat, counts, texts, starts).tolist() == want


def test_rows_without_steps_are_left_alone():
    tokenizer = build_char_tokenizer()
    ids = tokenizer("1+2=3", add_special_tokens=False)["input_ids"]
    experience = _experience([ids, ids], prompt=2, pad=0)
    rewards, marks = _placed(tokenizer, experience, [(), ((5, -1.0), (5, 0.5))], ["1+2=3"] * 2)
    assert rewards[0].abs().sum() == 0 and marks[0].sum() == 0
    assert rewards[1].nonzero().squeeze(1).tolist() == [2 + 4] and rewards[1, 6] == -0.5 and marks[1].sum() == 1
