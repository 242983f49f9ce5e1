"""The generated tiny math task (``dtppo.data.tiny_math``): deterministic, correct worked solutions for each kind,
hard problems mixed in at their share, careless answers always wrong, and validation questions never in training."""

from dtppo.config import TinyMathConfig
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
