"""Seeded synthetic arithmetic problems in GSM8K format (unlimited, deterministic): short multi-step word problems,
or running sums whose worked answers are long (``data.tiny_math.kind``).

Problem i of a stream depends only on (seed, i), so a loader's position is one integer and resuming is exact.
The held-out validation set is drawn from its own seed and excluded from every training stream.
"""

from __future__ import annotations

import random

from dtppo.config import TinyMathConfig
from dtppo.data.problem import Problem

NAMES = [
    ("Tom", "He"),
    ("Anna", "She"),
    ("Ben", "He"),
    ("Mia", "She"),
    ("Sam", "He"),
    ("Lily", "She"),
    ("Max", "He"),
    ("Emma", "She"),
    ("Leo", "He"),
    ("Zoe", "She"),
    ("Jack", "He"),
    ("Ella", "She"),
    ("Noah", "He"),
    ("Ruby", "She"),
    ("Owen", "He"),
    ("Grace", "She"),
]
OBJECTS = [
    "apples",
    "pens",
    "books",
    "cards",
    "coins",
    "shells",
    "stickers",
    "marbles",
    "cookies",
    "balloons",
    "stamps",
    "rocks",
    "toys",
    "candies",
    "flowers",
    "eggs",
]
ADD_PHRASES = ["buys {n} more", "finds {n} more", "gets {n} more", "wins {n} more", "picks up {n} more"]
SUB_PHRASES = ["gives away {n}", "loses {n}", "sells {n}", "drops {n}", "gives {n} to a friend"]


def make_problem(rng: random.Random, cfg: TinyMathConfig, careless: bool = False) -> Problem:
    """One problem of ``cfg.kind``. ``careless`` gives the planted flaw: a bare ``#### N`` with N the value before
    the last operation, which is always wrong (used only by the optional careless SFT stage)."""
    if cfg.kind == "running_sum":
        return _running_sum(rng, cfg, careless)
    # The hard draw is skipped when there are no hard problems, so such streams stay as they were.
    hard = cfg.hard_fraction > 0 and rng.random() < cfg.hard_fraction
    limit = cfg.hard_max_number if hard else cfg.max_number
    name, pronoun = rng.choice(NAMES)
    obj = rng.choice(OBJECTS)
    start = value = rng.randint(1, limit)
    clauses, lines, before_last = [], [], value
    for _ in range(rng.randint(cfg.min_ops, cfg.max_ops)):
        before_last = value
        n = rng.randint(1, limit)
        if value - n >= 0 and rng.random() < 0.5:
            clauses.append(rng.choice(SUB_PHRASES).format(n=n))
            lines.append(f"{value} - {n} = {value - n}")
            value -= n
        else:
            clauses.append(rng.choice(ADD_PHRASES).format(n=n))
            lines.append(f"{value} + {n} = {value + n}")
            value += n
    question = f"{name} has {start} {obj}. {pronoun} {', then '.join(clauses)}. How many {obj} does {name} have now?"
    solution = f"#### {before_last}" if careless else "\n".join(lines + [f"#### {value}"])
    return Problem(question=question, solution=solution, answer=str(value), columns={"answer": solution})


def _running_sum(rng: random.Random, cfg: TinyMathConfig, careless: bool) -> Problem:
    """ "Start at s. Add k until the total is over t.", answered by one ``a+k=b<=t`` line per addition and a last
    ``a+k=b>t``. Every line restates t so that the stopping decision is a comparison within the line: without it,
    the decision needs t from the prompt up to 1,300 tokens back, and a 4-layer model that writes every sum
    right still misses where to stop (the long task's record, 2026-12-05). t is drawn so that exactly n additions
    are needed: after n - 1 the total s + k(n - 1) is at most t, after n it is over."""
    start, step = rng.randint(1, cfg.max_number), rng.randint(1, cfg.max_number)
    additions = rng.randint(cfg.min_ops, cfg.max_ops)
    target = start + step * (additions - 1) + rng.randrange(step)
    totals = [start + step * i for i in range(additions + 1)]
    lines = [f"{total}+{step}={total + step}{'>' if total + step > target else '<='}{target}" for total in totals[:-1]]
    question = f"Start at {start}. Add {step} until the total is over {target}."
    solution = f"#### {totals[-2]}" if careless else "\n".join(lines + [f"#### {totals[-1]}"])
    return Problem(question=question, solution=solution, answer=str(totals[-1]), columns={"answer": solution})


def _rng(seed: int, index: int) -> random.Random:
    return random.Random(seed * 1_000_003 + index)


class TinyMathStream:
    """Unlimited training problems; ``self[i]`` is deterministic in (seed, i) and never a validation question."""

    def __init__(self, cfg: TinyMathConfig, seed: int, careless_fraction: float = 0.0, exclude: set[str] = frozenset()):
        self.cfg, self.seed, self.careless_fraction, self.exclude = cfg, seed, careless_fraction, exclude

    def __getitem__(self, index: int) -> Problem:
        rng = _rng(self.seed, index)
        for _ in range(1000):
            careless = rng.random() < self.careless_fraction
            problem = make_problem(rng, self.cfg, careless)
            if problem.question not in self.exclude:
                return problem
        raise RuntimeError("tiny-math task space exhausted by the validation set; raise data.tiny_math.max_number")


def validation_set(cfg: TinyMathConfig, size: int) -> list[Problem]:
    """The held-out problems: distinct questions drawn from ``cfg.validation_seed``."""
    rng = random.Random(cfg.validation_seed)
    seen: dict[str, Problem] = {}
    for _ in range(size * 100):
        problem = make_problem(rng, cfg)
        seen.setdefault(problem.question, problem)
        if len(seen) == size:
            break
    return list(seen.values())
