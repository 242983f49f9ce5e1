"""The process reward model (``rewards.process_model``): steps cut where the recipe says, read at the token holding
each step's (or its tag's) last character, each step's score equal to a float64 forward of the text up to that token
alone, batch-invariant, and every bad directory or setting refused in one line before anything is unpickled."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from dtppo.config import ProcessModelConfig
from dtppo.errors import InputError
from dtppo.models.tokenizer import load_tokenizer
from dtppo.rewards.process_model import ProcessRewardModel, read_tokens, rendered, step_spans, tagged
from tests.support.hf_fixtures import with_pickled_weights
from tests.support.prm_fixture import causal_lm_prm, token_classification_prm

CPU = torch.device("cpu")
QUESTION = "Tom has 3 apples and buys 4 more. How many?"
COMPLETIONS = [
    "3+4=7\nHe has 7 apples.\n#### 7",
    "3*4=12\n\n  \nSo 12",
    "",
    "   ",
    "no separator at all",
    "ends with the separator\n",
]
# f32 against a float64 forward of a 2-layer, 32-wide model: rounding is ~1e-7 relative; 1e-5 leaves 100x.
ATOL = 1e-5


@pytest.fixture(scope="module")
def classification_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("prm")
    return {n: token_classification_prm(root / f"labels{n}", num_labels=n) for n in (1, 2)}


@pytest.fixture(scope="module")
def causal_dir(tmp_path_factory):
    return causal_lm_prm(tmp_path_factory.mktemp("causal") / "prm")


def causal_cfg(path, **kw) -> ProcessModelConfig:
    fields = dict(path=str(path), head="causal_lm", step_tag=" ки", good_token="+", bad_token="-")
    return ProcessModelConfig(**(fields | kw))


def test_steps_are_the_non_blank_pieces_between_separators():
    text = "a=1\n\n  \nb=2 \nc"
    assert [text[s:e] for s, e in step_spans(text, "\n")] == ["a=1", "b=2 ", "c"]
    assert step_spans("", "\n") == [] and step_spans(" \n ", "\n") == []
    dotted = "x. y. z"
    assert [dotted[s:e] for s, e in step_spans(dotted, ". ")] == ["x", "y", "z"]


def test_a_tag_follows_each_step_and_the_read_offset_ends_it():
    text = "a=1\nbb=2\n"
    spans = step_spans(text, "\n")
    tagged_text, reads = tagged(text, spans, " ки")
    assert tagged_text == "a=1 ки\nbb=2 ки\n"
    assert [tagged_text[r - 3 : r] for r in reads] == [" ки", " ки"]
    assert tagged(text, spans, None) == (text, [3, 8])


@pytest.mark.parametrize("seed", range(20))
def test_the_read_token_holds_the_character_as_decoding_every_prefix_finds(causal_dir, seed):
    tokenizer = load_tokenizer(str(causal_dir))
    rng = random.Random(seed)
    text = "".join(rng.choice("ab 12+=\n.,ки×é") for _ in range(rng.randint(1, 60)))
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"]
    starts = torch.tensor([s for s, _ in encoded["offset_mapping"]])
    chars = torch.arange(len(text))
    tokens = read_tokens(starts, chars)
    for c, t in zip(chars.tolist(), tokens.tolist()):
        # the token that holds character c: the shortest prefix of tokens decoding to text[: c + 1]
        shortest = next(i for i in range(len(ids) + 1) if tokenizer.decode(ids[:i]).startswith(text[: c + 1]))
        assert t == shortest - 1, (text, c)


def test_the_chat_template_or_the_plain_text_form_holds_the_completion(classification_dirs, causal_dir):
    with_template = load_tokenizer(str(classification_dirs[1]))
    text, start = rendered(with_template, QUESTION, "3+4=7", "Be brief.")
    assert text[start : start + 5] == "3+4=7" and "Be brief." in text
    plain = load_tokenizer(str(causal_dir))
    assert rendered(plain, QUESTION, "3+4=7", None) == (f"{QUESTION} 3+4=7", len(QUESTION) + 1)


def _reference(prm: ProcessRewardModel, path, completion: str) -> list[tuple[int, float]]:
    """Each step's score from a float64 copy of the model run on the tokens up to its read token alone."""
    auto = AutoModelForCausalLM if prm.cfg.head == "causal_lm" else AutoModelForTokenClassification
    model = auto.from_pretrained(str(path), use_safetensors=True, dtype=torch.float64).eval()
    spans = step_spans(completion, prm.cfg.separator)
    content, reads = tagged(completion, spans, prm.cfg.step_tag)
    text, offset = rendered(prm.tokenizer, QUESTION, content, None)
    encoded = prm.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    out = []
    for (_, end), read in zip(spans, reads):
        last = max(i for i, (s, _) in enumerate(encoded["offset_mapping"]) if s <= offset + read - 1)
        ids = torch.tensor([encoded["input_ids"][: last + 1]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, -1]
        if prm.cfg.head == "causal_lm":
            good, bad = prm.candidates.tolist()
            score = torch.softmax(logits[[good, bad]], -1)[0]
        else:
            score = torch.sigmoid(logits[0]) if logits.shape[0] == 1 else torch.softmax(logits, -1)[1]
        out.append((end, float(score)))
    return out


def _assert_matches(got, want):
    assert [e for e, _ in got] == [e for e, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=ATOL)


@pytest.mark.parametrize("labels", [1, 2])
def test_token_classification_scores_equal_each_steps_prefix_alone(classification_dirs, labels):
    path = classification_dirs[labels]
    prm = ProcessRewardModel(ProcessModelConfig(path=str(path), batch_size=4), None, CPU)
    scores = prm.score([QUESTION] * len(COMPLETIONS), COMPLETIONS)
    assert scores[2] is None and scores[3] is None  # no step, no score
    for completion, got in zip(COMPLETIONS, scores):
        if got is not None:
            _assert_matches(got, _reference(prm, path, completion))
    values = [s for steps in scores if steps for _, s in steps]
    assert max(values) - min(values) > 0.1  # the reference compares scores that differ from step to step


def test_math_shepherds_form_scores_equal_each_tags_prefix_alone(causal_dir):
    prm = ProcessRewardModel(causal_cfg(causal_dir, batch_size=3), None, CPU)
    scores = prm.score([QUESTION] * len(COMPLETIONS), COMPLETIONS)
    for completion, got in zip(COMPLETIONS, scores):
        if got is not None:
            _assert_matches(got, _reference(prm, causal_dir, completion))
    # negative control: reading the step's own last token instead of its tag gives other scores
    untagged = ProcessRewardModel(causal_cfg(causal_dir, step_tag="\t"), None, CPU).score([QUESTION], COMPLETIONS[:1])
    assert [s for _, s in untagged[0]] != pytest.approx([s for _, s in scores[0]], abs=ATOL)


def test_scores_do_not_depend_on_the_batch_or_its_padding(classification_dirs):
    path = classification_dirs[2]
    one = ProcessRewardModel(ProcessModelConfig(path=str(path), batch_size=1), None, CPU)
    many = ProcessRewardModel(ProcessModelConfig(path=str(path), batch_size=8), None, CPU)
    prompts = [QUESTION] * len(COMPLETIONS)
    for a, b in zip(one.score(prompts, COMPLETIONS), many.score(prompts, COMPLETIONS)):
        assert (a is None) == (b is None)
        if a is not None:
            _assert_matches(a, b)


def test_a_long_input_keeps_its_last_tokens_and_drops_the_steps_before_them(classification_dirs):
    path = classification_dirs[1]
    completion = "\n".join(f"{i}+1={i + 1}" for i in range(30))
    full = ProcessRewardModel(ProcessModelConfig(path=str(path)), None, CPU).score([QUESTION], [completion])[0]
    cut = ProcessRewardModel(ProcessModelConfig(path=str(path), max_length=60), None, CPU).score(
        [QUESTION], [completion]
    )[0]
    assert len(full) == 30 and 0 < len(cut) < 30
    assert [e for e, _ in cut] == [e for e, _ in full[-len(cut) :]]  # the last steps kept, in place


def test_pickled_weights_are_refused_before_anything_is_unpickled(classification_dirs, tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    path = with_pickled_weights(classification_dirs[1], tmp_path / "pickled", marker)
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load called"))
    with pytest.raises(InputError, match=r"^reward.process_model.path: .*pickle"):
        ProcessRewardModel(ProcessModelConfig(path=str(path)), None, CPU)
    assert not marker.exists()


def test_bad_directories_and_tokens_are_refused_in_one_line(classification_dirs, causal_dir, tmp_path):
    cases = [
        (ProcessModelConfig(path=str(tmp_path / "missing")), "not a directory"),
        (causal_cfg(causal_dir, good_token="++ok"), r"good_token '\+\+ok' is \d+ tokens, not one"),
    ]
    for cfg, message in cases:
        with pytest.raises(InputError, match=message) as err:
            ProcessRewardModel(cfg, None, CPU)
        assert str(err.value).startswith("reward.process_model.path: ") and "\n" not in str(err.value)


def test_the_rewarder_adds_the_weighted_step_scores_to_each_samples_total(classification_dirs):
    from dtppo.data.problem import Problem
    from dtppo.rewards.rewarder import Rewarder
    from dtppo.testing.configs import tiny_config

    cfg = tiny_config(
        f"reward.process_model.path={classification_dirs[1]}", "reward.process_model.weight=0.5", "reward.num_workers=0"
    )
    rewarder = Rewarder(cfg.reward, None, cfg.cluster.backend, CPU)
    problems = [Problem(QUESTION, "", "7") for _ in COMPLETIONS]
    breakdown = rewarder.score(problems, COMPLETIONS)
    alone = ProcessRewardModel(cfg.reward.process_model, None, CPU).score([QUESTION] * len(COMPLETIONS), COMPLETIONS)
    assert breakdown.scores["process_model"] == alone
    assert breakdown.steps == [tuple((e, 0.5 * s) for e, s in steps) if steps else () for steps in alone]
    outcome = torch.tensor([float(c.endswith("#### 7")) for c in COMPLETIONS])  # gsm8k, the task's verifier
    want = outcome + torch.tensor([0.5 * sum(s for _, s in steps) if steps else 0.0 for steps in alone])
    assert breakdown.total.tolist() == pytest.approx(want.tolist(), abs=1e-6)
    sums = [sum(s for _, s in steps) for steps in alone if steps]
    assert breakdown.means()["process_model"] == pytest.approx(sum(sums) / len(sums))
    rewarder.close()
