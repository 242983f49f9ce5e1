"""LoRA against full fine-tuning on the tiny task (docs/measurements/2026-12-03-lora-vs-full-fine-tuning.md): the
critic's recipe from several SFT models, policy and critic both with adapters (rank 16, alpha 32, all-linear) at the
full run's learning rates and at 10 times them; paired by SFT model, each LoRA arm minus full fine-tuning."""

from __future__ import annotations

from bench.learning.driver import Experiment, main

LORA = [f"{role}.lora.{key}" for role in ("policy", "value") for key in ("rank=16", "alpha=32")]
POLICY_LR, CRITIC_LR = 1e-4, 1e-3  # the recipe's


def rates(times: int) -> list[str]:
    return [f"policy.optimizer.lr={times * POLICY_LR}", f"value.optimizer.lr={times * CRITIC_LR}"]


SPECS = {
    "lora": Experiment(
        name="lora_learning",
        question="LoRA against full fine-tuning on the tiny task, over SFT models",
        recipe="recipes/tiny-math-critic-cpu.yaml",
        arms={"full": [], "lora-lr1x": [*LORA, *rates(1)], "lora-lr10x": [*LORA, *rates(10)]},
        metrics=["accuracy_start", "accuracy_best", "accuracy_final", "explained_var_last_half_mean"],
        pairs={"versus_full": [("lora-lr1x", "full"), ("lora-lr10x", "full")]},
        sft_seeds=(0, 1, 2),
    ),
}

if __name__ == "__main__":
    main(SPECS)
