import json

import pytest

from dtppo.config import TinyMathConfig
from dtppo.data.formats import GSM8K
from dtppo.data.loader import PromptLoader
from dtppo.data.rows import read_jsonl
from dtppo.data.tiny_math import TinyMathStream, validation_set
from dtppo.rewards.verifiers.gsm8k import gsm8k_reward

CFG = TinyMathConfig()


def test_tiny_math_is_deterministic_and_correct():
    stream = TinyMathStream(CFG, seed=3)
    again = TinyMathStream(CFG, seed=3)
    for i in range(300):
        p = stream[i]
        assert p == again[i]
        assert gsm8k_reward(p.solution, p.answer) == 1.0
        # every worked line is true arithmetic
        for line in p.solution.splitlines()[:-1]:
            lhs, rhs = line.split(" = ")
            assert eval(lhs) == int(rhs) >= 0  # noqa: S307 - our own generated text
        assert 1 <= len(p.solution.splitlines()) - 1 <= CFG.max_ops
    assert stream[0] != TinyMathStream(CFG, seed=4)[0]


def test_running_sums_need_exactly_their_additions_and_write_every_total():
    cfg = TinyMathConfig(kind="running_sum", max_number=9, min_ops=80, max_ops=120)
    stream = TinyMathStream(cfg, seed=3)
    for i in range(200):
        p = stream[i]
        words = p.question.rstrip(".").split()
        start, step, target = int(words[2].rstrip(".")), int(words[4]), int(words[-1])
        *lines, last = p.solution.splitlines()
        assert 80 <= len(lines) <= 120 and gsm8k_reward(p.solution, p.answer) == 1.0
        total = start
        for i, line in enumerate(lines):  # the rule, applied independently of the generator: add while not over
            comparison = f">{target}" if i == len(lines) - 1 else f"<={target}"
            assert total <= target and line == f"{total}+{step}={total + step}{comparison}"
            total += step
        assert total > target and last == f"#### {total}" == f"#### {p.answer}"
    careless = TinyMathStream(cfg, seed=3, careless_fraction=1.0)[0]
    assert careless.solution == f"#### {int(careless.answer) - int(careless.question.split()[4])}"
    assert gsm8k_reward(careless.solution, careless.answer) == 0.0
    # word problems draw as they did before the kind existed
    assert TinyMathStream(TinyMathConfig(kind="word_problems"), seed=3)[0] == TinyMathStream(CFG, seed=3)[0]


def test_hard_problems_mix_in_at_their_share_and_leave_easy_streams_unchanged():
    mixed = TinyMathStream(TinyMathConfig(max_number=5, max_ops=1, hard_fraction=0.5, hard_max_number=999), seed=0)
    hard = 0
    for i in range(1000):
        p = mixed[i]
        numbers = [int(w.strip(".,")) for w in p.question.split() if w.strip(".,").isdigit()]
        assert max(numbers) <= 999 and gsm8k_reward(p.solution, p.answer) == 1.0
        hard += max(numbers) > 5
    assert 450 <= hard <= 550  # binomial(1000, 0.5): 3.2 standard deviations either side
    # hard_fraction 0 draws nothing extra: the default stream is the one every earlier run saw
    assert TinyMathStream(TinyMathConfig(hard_max_number=50), seed=3)[0] == TinyMathStream(CFG, seed=3)[0]
    assert TinyMathStream(CFG, seed=3)[0].question == (
        "Tom has 5 eggs. He wins 11 more, then gives 3 to a friend. How many eggs does Tom have now?"
    )


def test_careless_answers_are_always_wrong_bare_lines():
    stream = TinyMathStream(CFG, seed=0, careless_fraction=1.0)
    for i in range(200):
        p = stream[i]
        assert p.solution.startswith("#### ") and "\n" not in p.solution
        assert gsm8k_reward(p.solution, p.answer) == 0.0


def test_validation_questions_never_in_training():
    val = validation_set(CFG, 256)
    assert len(val) == 256 and len({p.question for p in val}) == 256
    exclude = {p.question for p in val}
    stream = TinyMathStream(CFG, seed=0, exclude=exclude)
    assert all(stream[i].question not in exclude for i in range(2000))


def test_prompt_loader_resumes_exactly():
    items = list(range(10))
    a = PromptLoader(items, seed=1)
    first = a.next_batch(7) + a.next_batch(7)
    assert sorted(first[:10]) == items  # one full epoch before repeating
    b = PromptLoader(items, seed=1)
    b.next_batch(7)
    c = PromptLoader(items, seed=1)
    c.load_state_dict(b.state_dict())
    assert c.next_batch(7) == first[7:]


def test_gsm8k_loader_skips_bad_rows(tmp_path):
    rows = [
        {"question": "q1", "answer": "work\n#### 1,200"},
        {"question": "q2"},
        {"question": "q3", "answer": "no marker"},
        {"question": "q4", "answer": "#### twelve"},
        "not a dict",
    ]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{broken json\n")
    problems = read_jsonl(path, GSM8K)[0]
    assert [(p.question, p.answer) for p in problems] == [("q1", "1200")]
    with pytest.raises(FileNotFoundError):
        read_jsonl(tmp_path / "missing.jsonl", GSM8K)[0]


def test_real_gsm8k_files_load(repo_root):
    import os

    test_path = os.path.join(repo_root, "tests/data/gsm8k/test.jsonl")  # GSM8K's first 300 test rows
    problems = read_jsonl(test_path, GSM8K)[0]
    assert len(problems) == 300 and problems[0].answer == "18"
