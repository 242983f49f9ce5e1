"""Does a critic earn its cost with step rewards on a long chain (docs/measurements/2026-12-07-critic-step-rewards.md,
the protocol written before its runs)? On recipes/tiny-chain-cpu.yaml, at 8 prompts x 4 samples per step, from the
sizing pilot's SFT models: PPO with a critic on the outcome (a), with the first wrong step penalised (b), (b) with
the long-chain settings (c); GRPO on the outcome (d), with process supervision (e). ``arithmetic_steps`` is logged
in every arm at weight 0: 1 minus its validation mean is the per-step error rate."""

from __future__ import annotations

import statistics

from bench.learning.driver import Experiment, main
from dtppo.observability.logger import explained_var_mean

COMMON = [
    "reward.functions=[gsm8k, arithmetic_first_error, arithmetic_steps]",
    "ppo.num_prompts_per_step=8",
    "ppo.num_generations_per_prompt=4",
    "ppo.validation.period=5",
]
GRPO = ["ppo.advantage_estimator=grpo", "value.warmup.steps=0"]
LONG_CHAIN = [
    "value.warmup.steps=0",
    "value.warmup.until_ev=0.3",
    "ppo.gae.lambda_value=1.0",
    "ppo.gae.length_adaptive_alpha=0.05",
]
ARMS = {
    "a_critic_outcome": [*COMMON, "reward.weights=[1, 0, 0]"],
    "b_critic_steps": [*COMMON, "reward.weights=[1, 1, 0]"],
    "c_critic_steps_long": [*COMMON, "reward.weights=[1, 1, 0]", *LONG_CHAIN],
    "d_grpo_outcome": [*COMMON, "reward.weights=[1, 0, 0]", *GRPO],
    "e_grpo_process": [*COMMON, "reward.weights=[1, 1, 0]", *GRPO],
}


def figures(records: list[dict], run: dict) -> dict:
    steps = [r for r in records if r["step"] >= 1]
    validations = [r for r in records if "validation/accuracy" in r]
    first, last = validations[0], validations[-1]
    critic = "train/critic/explained_var" in steps[-1]
    return {
        "accuracy_start": first["validation/accuracy"],
        "accuracy_final": last["validation/accuracy"],
        "accuracy_best": max(r["validation/accuracy"] for r in validations),
        "gain_final": last["validation/accuracy"] - first["validation/accuracy"],
        "step_error_start": 1.0 - first["validation/reward/arithmetic_steps"],
        "step_error_final": 1.0 - last["validation/reward/arithmetic_steps"],
        "step_error_change": first["validation/reward/arithmetic_steps"] - last["validation/reward/arithmetic_steps"],
        "explained_var_last_half": explained_var_mean(steps, run["steps"] / 2)[0] if critic else None,
        "seconds_per_step": statistics.median(r["timing/step"] for r in steps),
        "accuracy_curve": [(r["step"], r["validation/accuracy"]) for r in validations],
    }


SPECS = {
    "critic_step_rewards": Experiment(
        name="critic_step_rewards",
        question="PPO with a critic against GRPO, with and without step rewards, on a long chain of checkable steps",
        recipe="recipes/tiny-chain-cpu.yaml",
        arms=ARMS,
        metrics=["gain_final", "step_error_change", "explained_var_last_half", "seconds_per_step"],
        figures=figures,
        pairs={
            "b - a": ("b_critic_steps", "a_critic_outcome"),
            "c - a": ("c_critic_steps_long", "a_critic_outcome"),
            "b - e": ("b_critic_steps", "e_grpo_process"),
            "c - e": ("c_critic_steps_long", "e_grpo_process"),
            "e - d": ("e_grpo_process", "d_grpo_outcome"),
        },
        sft_seeds=(0, 1, 2),  # the first three of the sizing pilot at the floor
        sft_root="runs/chain-pilot",
        jobs=1,
    ),
}

if __name__ == "__main__":
    main(SPECS)
