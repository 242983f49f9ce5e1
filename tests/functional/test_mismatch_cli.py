"""The mismatch corrections engaged end to end: the generator's log-probs are lowered on purpose (test hook
``DTPPO_TEST_GEN_LOGPROB_ERROR=0.3``: sample i by 0.3·(i mod 3) per token), with sequence-level truncated IS
(cap 2) and sequence masking at 1.5. Samples with i mod 3 = 2 (error e^0.6 = 1.82) leave training; those with
i mod 3 = 1 (error e^0.3 = 1.35, kept) have π_old/π_gen = e^(0.3·len), capped at 2; the unperturbed third
(i mod 3 = 0) is the negative control: kept, with weights ~1."""

import math

from tests.support.cli import read_jsonl, run_cli
from tests.support.recipes import FAST, RANDOM_START, TINY

PROMPTS = 16  # FAST's ppo.num_prompts_per_step
CORRECTION = [
    "loss.rollout_correction.seq_logprob_error_threshold=1.5",
    "loss.rollout_correction.importance_sampling=sequence",
    "loss.rollout_correction.importance_sampling_cap=2.0",
]


def test_mismatch_correction_engages_on_the_mismatched_samples_only(tmp_path, monkeypatch):
    monkeypatch.setenv("DTPPO_TEST_GEN_LOGPROB_ERROR", "0.3")
    run_cli(
        [
            "ppo",
            TINY,
            *FAST,
            *RANDOM_START,
            "ppo.max_num_steps=1",
            "ppo.validation.at_start=false",
            "checkpointing.enabled=false",
            "logger.log_dir=log",
            *CORRECTION,
        ],
        tmp_path,
    )
    (r,) = read_jsonl(tmp_path / "log" / "metrics.jsonl")
    assert math.isfinite(r["train/loss"]) and math.isfinite(r["train/critic/loss"])
    # Exactly the i mod 3 = 2 samples: neither the unperturbed nor the mildly perturbed ones.
    assert r["train/num_masked_seqs_by_logprob_error"] == sum(i % 3 == 2 for i in range(PROMPTS))
    assert abs(r["train/seq_mult_prob_error/max"] - math.exp(0.6)) < 1e-3
    assert r["train/token_mult_prob_error"] > 1.2  # logged over every sample, the masked ones included
    assert abs(r["train/rollout_is/max"] - 2.0) < 1e-5  # i mod 3 = 1: e^(0.3·len) truncated
    assert abs(r["train/rollout_is/min"] - 1.0) < 1e-3  # i mod 3 = 0: the control inside the run
    assert 0.2 < r["train/rollout_is/capped_frac"] < 0.8 and 1.2 < r["train/rollout_is/mean"] < 1.8
