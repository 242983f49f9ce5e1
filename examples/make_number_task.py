"""Write the number task's rows: "Write a number bigger than N." with the columns ``threshold`` and ``topic``.

    python examples/make_number_task.py runs/number-task     # -> runs/number-task/{train,test}.jsonl

A dataset of your own making in the form dtppo reads: one JSON object per line, the prompt in ``prompt``, any
other columns beside it (every one reaches the reward functions).
"""

import json
import random
import sys
from pathlib import Path

TOPICS = ["apples", "stars", "steps", "coins"]


def rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        threshold, topic = rng.randint(1, 99), rng.choice(TOPICS)
        out.append(
            {"prompt": f"Write a number of {topic} bigger than {threshold}.", "threshold": threshold, "topic": topic}
        )
    return out


def main(out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, count, seed in [("train", 2000, 0), ("test", 64, 1)]:
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(count, seed)))
        print(f"wrote {out / name}.jsonl ({count} rows)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/number-task")
