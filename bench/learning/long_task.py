"""A long task that learns (docs/measurements/2026-12-05-long-task.md): running sums answered by every running
total, about 1,000 tokens per response (recipes/tiny-long-cpu.yaml), SFT and then PPO with a critic, policy and
critic context-parallel over 2 ranks: they use both cores, so runs go one at a time. Per run: validation accuracy at
the start (the SFT model's, greedy), best and final; the critic's explained variance over the last half of its steps;
the mean response length and the truncation rate at the start and at the end; seconds per step. ``--keep`` joins the
runs of an earlier record from the SFT seeds not run now."""

from __future__ import annotations

import statistics

from bench.learning.driver import Experiment, main
from dtppo.observability.logger import explained_var_mean


def figures(records: list[dict], run: dict) -> dict:
    steps = [r for r in records if r["step"] >= 1]
    accuracy = [(r["step"], r["validation/accuracy"]) for r in records if "validation/accuracy" in r]
    return {
        "accuracy_start": accuracy[0][1],
        "accuracy_best": max(a for _, a in accuracy),
        "accuracy_final": accuracy[-1][1],
        "gain_final": accuracy[-1][1] - accuracy[0][1],
        "explained_var_last_half": explained_var_mean(steps, run["steps"] / 2)[0],
        "response_length_first": steps[0]["train/mean_gen_tokens_per_sample"],
        "response_length_last": steps[-1]["train/mean_gen_tokens_per_sample"],
        "truncation_rate_first": steps[0]["train/truncation_rate"],
        "truncation_rate_last": steps[-1]["train/truncation_rate"],
        "seconds_per_step": statistics.median(r["timing/step"] for r in steps),
        "accuracy_curve": accuracy,
        "reward_curve": [(r["step"], r["train/reward"]) for r in steps],
        "explained_var_curve": [(r["step"], r["train/critic/explained_var"]) for r in steps],
    }


SPECS = {
    "long_task": Experiment(
        name="long_task",
        question="a long task (running sums, ~1k-token answers): SFT, then PPO with a critic at cp=2, over SFT models",
        recipe="recipes/tiny-long-cpu.yaml",
        arms={"ppo": []},
        metrics="""accuracy_start accuracy_best accuracy_final gain_final explained_var_last_half
            response_length_first response_length_last""".split(),
        figures=figures,
        layout="flat",
        sft_seeds=(0, 1, 2),
        jobs=1,
    ),
}

if __name__ == "__main__":
    main(SPECS)
