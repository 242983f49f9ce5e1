"""The critic experiments, a table each, with the PPO seeds as the units (``--sft-seeds``: the SFT models):

    python -m bench.learning.critic alignment   # V(s_t) aligned to the state before each token, or read one late
    python -m bench.learning.critic grpo        # PPO with a critic (GAE) against GRPO, at equal samples
    python -m bench.learning.critic clean       # PPO's gain from an SFT model without the careless stage
    python -m bench.learning.critic warmup      # the critic trained alone: one critic setting changed per arm

Every arm of a table starts from the same SFT model and differs only in its overrides and ``ppo.seed``. GRPO at equal
samples: ``num_prompts_per_step / 4`` prompts x 4 samples against the critic arm's prompts x 1, the same steps, no
critic warmup; at equal wall time, ``accuracy_at_equal_time``: each run's last validation accuracy within the faster
arm's training time (steps x median step seconds, mean over seeds; medians, so that a step slowed by another job does
not count). `make demo` runs the alignment table with one seed per arm.
"""

from __future__ import annotations

import statistics

from bench.learning.driver import Experiment, main
from dtppo import config as config_lib

RECIPE = "recipes/tiny-math-cpu.yaml"
GROUP = 4  # GRPO's samples per prompt
# The warmup table's arms: one critic setting changed from the recipe's at a time.
WARMUP_ARMS = {
    "base": [],
    "lr3e-4": ["value.optimizer.lr=3e-4"],
    "lr3e-3": ["value.optimizer.lr=3e-3"],
    "epochs4": ["ppo.ppo_epochs=4"],
    "batch64": ["value.train_global_batch_size=64"],
    "batch16": ["value.train_global_batch_size=16", "value.train_micro_batch_size=16"],
    "head0": ["value.head_init_std=0"],
    "noclip": ["loss.value_clip=null"],
}
METRICS = """accuracy_start accuracy_best accuracy_final gain_best gain_final explained_var_last_half_mean
    decision_token_advantage train_seconds step_seconds_median validation_seconds accuracy_at_equal_time""".split()


def grpo_arms(base: config_lib.Config) -> dict[str, list[str]]:
    prompts = base.ppo.num_prompts_per_step
    if prompts % GROUP:
        raise SystemExit(f"GRPO's {GROUP} samples per prompt must divide ppo.num_prompts_per_step = {prompts}")
    grpo = [f"ppo.num_prompts_per_step={prompts // GROUP}", f"ppo.num_generations_per_prompt={GROUP}"]
    # no critic, so no critic warmup: the policy trains from the first step
    return {
        "gae": ["ppo.advantage_estimator=gae"],
        "grpo": ["ppo.advantage_estimator=grpo", *grpo, "value.warmup.steps=0"],
    }


def warmup_arms(base: config_lib.Config) -> dict[str, list[str]]:
    """The policy frozen for the whole run (and validated at its end only), one critic setting per arm."""
    steps = base.ppo.max_num_steps
    frozen = [f"value.warmup.steps={steps}", f"ppo.validation.period={steps}"]
    return {arm: [*frozen, *extra] for arm, extra in WARMUP_ARMS.items()}


def clean_arms(base: config_lib.Config) -> dict[str, list[str]]:
    return {"clean": ["sft.careless_stage.num_steps=0", f"sft.output_dir={base.sft.output_dir}_clean"]}


def accuracy_within(records: list[dict], seconds: float) -> float:
    """The last validation accuracy reached within ``seconds`` of training, each step counted at the run's median
    step time (a step slowed by another job does not move the budget; validation not counted)."""
    median = statistics.median(r["timing/step"] for r in records if "timing/step" in r)
    accuracy = [(r["step"], r["validation/accuracy"]) for r in records if "validation/accuracy" in r]
    return [a for step, a in accuracy if step * median <= seconds][-1]


def equal_time(runs: list[dict], records: list[list[dict]]) -> None:
    """Each run's ``accuracy_at_equal_time``, within the faster arm's mean training time."""
    budget = min(
        statistics.fmean(r["steps"] * r["result"]["step_seconds_median"] for r in runs if r["arm"] == arm)
        for arm in dict.fromkeys(r["arm"] for r in runs)
    )
    for run, run_records in zip(runs, records):
        run["result"]["accuracy_at_equal_time"] = accuracy_within(run_records, budget)


def table(name: str, question: str, arms, seeds: tuple[int, ...], **more) -> Experiment:
    """A critic table: its runs one at a time at torch's threads, the SFT models shared by every table."""
    return Experiment(
        name=f"critic_{name}",
        question=question,
        recipe=RECIPE,
        arms=arms,
        metrics=METRICS,
        layout="table",
        seeds=seeds,
        runs=f"runs/critic/{name}",
        sft_root="runs/critic/sft",
        threads=None,
        jobs=1,
        fields={"table": name},
        **more,
    )


SPECS = {
    "alignment": table(
        "alignment",
        "the critic's values aligned to the state before each token (value.shift_values) or read one token late",
        {"shift": ["value.shift_values=true"], "noshift": ["value.shift_values=false"]},
        (0, 1, 2, 3, 4),
    ),
    "grpo": table(
        "grpo", "PPO with a critic (GAE) against GRPO at equal samples", grpo_arms, (0, 1, 2), after=equal_time
    ),
    "clean": table("clean", "PPO's gain from a clean SFT model (no careless stage)", clean_arms, (0, 1, 2)),
    "warmup": table("warmup", "the critic trained alone, one setting changed per arm", warmup_arms, (0,)),
}

if __name__ == "__main__":
    main(SPECS)
