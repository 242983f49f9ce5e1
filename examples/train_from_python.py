"""The number task (examples/number-task.yaml) trained from Python: rows made in memory, a reward closure beside the
functions of examples/number_rewards.py, a callback that prints each validation, the results as an object.

    python examples/train_from_python.py [--steps 20] [--out runs/number-task-python]

The same run as ``dtppo ppo examples/number-task.yaml`` with its data and functions passed as Python objects
(docs/guides/python-api.md). A script that starts a run keeps its work under ``if __name__ == "__main__":``: the
scoring processes are new interpreters, and Python imports the script's main module in each.
"""

import argparse
from pathlib import Path

from make_number_task import rows  # examples/ is this script's directory, first on sys.path
from number_rewards import bigger_number, digit_share

import dtppo

RECIPE = Path(__file__).resolve().parent / "number-task.yaml"


def ends_with_margin(margin: int):
    """A reward closure: 1.0 when the answer clears the row's threshold by at least ``margin``, else 0.0; None
    when the answer is not a number."""

    def cleared_by_margin(completions, threshold, **kwargs):
        scores = []
        for text, limit in zip(completions, threshold):
            digits = text.strip().split(" ")[0]
            scores.append(float(int(digits) >= limit + margin) if digits.isdigit() else None)
        return scores

    return cleared_by_margin


class PrintValidations:
    """A callback: one line per validation."""

    def on_validation_end(self, step, metrics):
        print(f"step {step}: validation reward {metrics['validation/reward']:.3f}", flush=True)


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--steps", type=int, default=20)
    cli.add_argument("--out", type=Path, default=Path("runs/number-task-python"))
    args = cli.parse_args()
    config = dtppo.load_config(
        RECIPE,
        [
            f"ppo.max_num_steps={args.steps}",
            f"logger.log_dir={args.out}",
            f"checkpointing.checkpoint_dir={args.out}/checkpoints",
            # the names of the functions passed below, so that their weights can be set with them
            "reward.functions=[digit_share, bigger_number, cleared_by_margin]",
            "reward.weights=[0.5, 1.0, 0.5]",
        ],
    )
    trainer = dtppo.PPOTrainer(
        config,
        reward_funcs=[digit_share, bigger_number, ends_with_margin(10)],
        train_dataset=rows(2000, seed=0),
        eval_dataset=rows(64, seed=1),
        callbacks=[PrintValidations()],
    )
    results = trainer.train()
    print(results.table())
    print(f"final validation reward: {results.reward_end:.3f} (start {results.reward_start:.3f})")


if __name__ == "__main__":
    main()
