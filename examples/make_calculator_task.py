"""Write the calculator task's rows, GSM8K-style (``question``, ``answer`` ending in ``#### N``): tiny arithmetic word
problems of two difficulties, half with numbers up to 5 (the tiny model computes them) and half with numbers up to
999 (it cannot), marked in a column ``hard``. Worked solutions of easy problems compute in the text; of hard ones,
a share ``--tool-share`` call the calculator and copy its result, the rest compute in the text (what the model cannot
learn to do).

    python examples/make_calculator_task.py runs/calculator-task     # -> runs/calculator-task/{train,test}.jsonl
"""

import argparse
import json
import random
from pathlib import Path

from dtppo.config import TinyMathConfig
from dtppo.data.tiny_math import make_problem

TASK = TinyMathConfig(max_number=5, max_ops=1, hard_fraction=0.5, hard_max_number=999)


def is_hard(problem) -> bool:
    """Whether a number in the problem is beyond what the easy half uses."""
    expression = problem.solution.splitlines()[0].split(" = ")[0]  # "a + b" (one operation)
    return max(int(n) for n in expression.split(" ") if n.isdigit()) > TASK.max_number


def solution(problem, rng: random.Random, tool_share: float) -> str:
    """A worked solution: the task's own (``a + b = c``) or, for a hard problem, a calculator call."""
    expression, result = problem.solution.splitlines()[0].split(" = ")
    if not is_hard(problem) or rng.random() >= tool_share:
        return problem.solution
    return f"<calc>{expression.replace(' ', '')}</calc><result>{result}</result>\n#### {result}"


def rows(count: int, seed: int, tool_share: float, exclude: set[str]) -> list[dict]:
    rng, out = random.Random(seed), []
    while len(out) < count:
        problem = make_problem(rng, TASK)
        if problem.question not in exclude:
            row = {"question": problem.question, "answer": solution(problem, rng, tool_share), "hard": is_hard(problem)}
            out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", default="runs/calculator-task")
    parser.add_argument("--tool-share", type=float, default=0.5, help="hard solutions that call the calculator")
    parser.add_argument("--train", type=int, default=20000)
    parser.add_argument("--test", type=int, default=256)
    args = parser.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    test = rows(args.test, 1, 1.0, set())
    train = rows(args.train, 0, args.tool_share, {r["question"] for r in test})
    for name, data in [("train", train), ("test", test)]:
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
        print(f"wrote {out / name}.jsonl ({len(data)} rows)")


if __name__ == "__main__":
    main()
