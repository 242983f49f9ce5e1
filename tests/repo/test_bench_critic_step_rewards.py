"""bench/learning/critic_step_rewards.py's figures from a run's metrics, and the sentences of docs/guides/learning.md
and its record that sum up bench/results/learning/critic_step_rewards.json: recomputed from the JSON, so a changed
record changes them."""

import json

from bench.common.paths import LEARNING
from bench.learning import critic_step_rewards
from tests.support.recipes import REPO


def _interval(stat: dict) -> str:
    return f"{stat['mean']:+.3f} [{stat['ci95_low']:+.3f}, {stat['ci95_high']:+.3f}]".replace("-", "−")


def _doc(path: str) -> str:
    return " ".join((REPO / path).read_text().split())


def test_the_per_step_error_is_one_minus_the_step_verifier_s_mean():
    records = [{"step": 0, "validation/accuracy": 0.5, "validation/reward/arithmetic_steps": 0.75}]
    records += [{"step": s, "timing/step": float(s), "train/critic/explained_var": 0.1} for s in range(1, 5)]
    records[-1] |= {"validation/accuracy": 0.25, "validation/reward/arithmetic_steps": 0.5}
    got = critic_step_rewards.figures(records, {"steps": 4})
    assert (got["step_error_start"], got["step_error_final"], got["step_error_change"]) == (0.25, 0.5, 0.25)
    assert (got["gain_final"], got["accuracy_best"], got["seconds_per_step"]) == (-0.25, 0.5, 2.5)
    assert abs(got["explained_var_last_half"] - 0.1) < 1e-12  # steps 3 and 4


def test_the_docs_state_the_record_s_gains_and_pairs():
    summary = json.loads((LEARNING / "critic_step_rewards.json").read_text())["summary"]
    guide = _doc("docs/guides/learning.md")
    record = _doc("docs/measurements/2026-12-07-critic-step-rewards.md")
    arms = summary["per_arm"]
    for arm in ("a_critic_outcome", "b_critic_steps", "d_grpo_outcome", "e_grpo_process"):
        assert _interval(arms[arm]["gain_final"]) in guide and _interval(arms[arm]["gain_final"]) in record, arm
    for pair in ("b - a", "e - d"):
        assert _interval(summary[pair]["gain_final"]) in guide, pair
    for pair in ("b - a", "c - a", "b - e", "c - e", "e - d"):
        assert _interval(summary[pair]["step_error_change"]) in record, pair
    changed = dict(arms["a_critic_outcome"]["gain_final"], mean=0.5)  # the negative control: another figure
    assert _interval(changed) not in guide
