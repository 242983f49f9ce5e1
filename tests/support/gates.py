"""The gates the CLI runs' records pass (tests/functional: the PPO, GRPO, multi-rank and vLLM runs).

``assert_reference_gates`` are NeMo-RL's smoke-test gates, kept because they mirror the reference's test suite.
Three of them hold by construction in these runs and only catch a NaN or a missing key: the clamped probability
ratio lies in [1 - 0.2, 1 + 0.2] because the loss clamps it there, EV <= 1 by definition, and 0/1 rewards average
into [0, 1]. Beside each, ``gate_failures`` holds one that a broken run fails (tests/functional/test_ppo_cli.py runs
each broken run and shows it fail exactly its gate):

| reference gate (by construction) | gate that can fail                            | broken run that fails it  |
|----------------------------------|-----------------------------------------------|---------------------------|
| clamped ratio in the clip band   | the policy moved between epochs (ratio != 1)  | advantages zeroed         |
| EV <= 1                          | the returns vary exactly when the rewards do  | the reward not in returns |
| 0 <= reward <= 1                 | a mixed step's advantages take both signs     | advantages zeroed         |
| token_mult_prob_error < 1.05     | token_mult_prob_error within the fp32 level   | generator log-probs off   |
"""

from __future__ import annotations

import math

# The generator's log-probs against the trainer's on the fp32 torch backend (the same weights, the sampler's
# forward against the trainer's): exp(mean |difference|) is 1 to float32 resolution (ulp(1) = 1.19e-7) in every run
# measured; 1e-6 is ~8 ulps. A generator whose log-probs are off by 1e-3 per token scores ~1.0007.
TORCH_MISMATCH_LIMIT = 1.0 + 1e-6
# A policy whose update reached its weights shows, in its second epoch, ratios beyond 1 +- this (the tiny recipe's
# reach the clip band, 0.8 and 1.2); with the policy loss's gradient at 0, AdamW's weight decay alone moves them
# ~1e-4.
MOVED = 1e-2


def assert_reference_gates(records: list[dict], critic: bool = True) -> None:
    """NeMo-RL's smoke gates on every step's record (with the clip 0.2/0.2 of these runs)."""
    for r in records:
        assert r["train/token_mult_prob_error"] < 1.05 or r.get("train/staleness/max", 0.0) > 0
        assert 0.79 < r["train/probs_ratio_clamped_min"] < 1.21
        assert 0.79 < r["train/probs_ratio_clamped_max"] < 1.29
        assert 0.0 <= r["train/reward"] <= 1.0
        assert math.isfinite(r["train/loss"]) and math.isfinite(r["train/grad_norm"])
        if critic:
            assert 0 <= r["train/critic/loss"] < 6
            assert r["train/critic/explained_var"] <= 1.0001
            assert math.isfinite(r["train/critic/grad_norm"]) and r["train/critic/grad_norm"] < 350


def gate_failures(records: list[dict], critic: bool = True, mismatch_limit: float | None = TORCH_MISMATCH_LIMIT):
    """The gates beside the reference's that a broken run fails, by name: [] when every one holds.

    ``records``: the steps of a run with ``ppo.ppo_epochs >= 2`` (so a moving policy shows a ratio != 1) and 0/1
    rewards; ``mismatch_limit``: None where the generator is not the fp32 torch sampler of the current policy. The
    reward-dependent gates read the steps whose rewards are mixed (and, for the returns, the others too)."""
    failures = []
    # a batch sampled by an older policy (ppo.max_lag) differs from π_old by design, not by numerics
    fresh = [r["train/token_mult_prob_error"] for r in records if r.get("train/staleness/max", 0.0) == 0.0]
    if mismatch_limit is not None and max(fresh, default=1.0) >= mismatch_limit:
        failures.append("mismatch")
    if not any(
        r["train/probs_ratio_clamped_max"] > 1 + MOVED or r["train/probs_ratio_clamped_min"] < 1 - MOVED
        for r in records
    ):
        failures.append("policy_moved")
    mixed = [r for r in records if 0.0 < r["train/reward"] < 1.0]  # none in a run never rewarded: nothing to check
    if not all(r["train/advantages/min"] < 0.0 < r["train/advantages/max"] for r in mixed):
        failures.append("advantages_signed")
    # γ = λ = 1, outcome rewards: each token's return is its sample's reward, so the returns vary iff the rewards do
    if critic and not all((r["train/critic/returns_var"] > 1e-8) == (r in mixed) for r in records):
        failures.append("returns_carry_reward")
    return failures
