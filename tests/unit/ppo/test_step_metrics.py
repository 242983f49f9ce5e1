"""A PPO step's metrics (``dtppo.ppo.step_metrics``) against numbers written out here: the samples, the mismatch
between generator and trainer, the advantages over the samples that train, each filter's figures where its option
is on, the staleness, the episodes, the critic's fit, the timings, and the whole ``train/*`` of a step. NaN sits on
every position off the response, where no metric may look."""

import math

import pytest
import torch

from dtppo.algorithms.advantages import outcome_returns
from dtppo.algorithms.losses import explained_var
from dtppo.config import from_dict
from dtppo.observability.timing import PhaseTimer
from dtppo.ppo.rollouts import Rollout, ScoredBatch
from dtppo.ppo.step_metrics import (
    critic_metrics,
    episode_metrics,
    rollout_metrics,
    staleness_metrics,
    timing_metrics,
    train_metrics,
)
from dtppo.types import Experience
from tests.support.episodes import hand_episode

NAN = float("nan")
MASK = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1], [1, 1, 1, 1]], dtype=torch.float32)
GEN = [[-0.5, -1.0], [-0.2, -0.3], [-1.0, -1.0, -1.0, -1.0]]
OLD = [[-0.5, -0.8], [-0.4, -0.3], [-1.0, -0.9, -1.1, -1.0]]
ADV = [[1.0, 2.0], [-3.0, 0.5], [0.25, 0.25, 0.25, 0.25]]


def _on_mask(rows) -> torch.Tensor:
    out = torch.full(MASK.shape, NAN)
    out[MASK.bool()] = torch.tensor([x for row in rows for x in row])
    return out


def _experience(**fields) -> Experience:
    return Experience(
        input_ids=torch.ones(3, 4, dtype=torch.long),
        attention_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]]),
        response_mask=MASK,
        gen_logprobs=_on_mask(GEN),
        truncated=torch.tensor([False, True, False]),
        rewards=torch.tensor([1.0, 0.0, 0.5]),
        old_logprobs=_on_mask(OLD),
        advantages=_on_mask(ADV),
        **fields,
    )


def _flat(rows):
    return [x for row in rows for x in row]


def test_the_samples_mismatch_and_advantages_against_float64_sums():
    m = rollout_metrics(from_dict({}), _experience(), scored=torch.tensor([1.0, 0.0, 1.0]))
    gen, old, adv = _flat(GEN), _flat(OLD), _flat(ADV)
    errors = [math.exp(abs(g - o)) for g, o in zip(gen, old)]
    ratios = [math.exp(o - g) for g, o in zip(gen, old)]
    seq = [sum(errors[0:2]) / 2, sum(errors[2:4]) / 2, sum(errors[4:]) / 4]
    want = {
        "train/reward": 0.75,  # over the scored samples only
        "train/advantages/mean": sum(adv) / 8,
        "train/advantages/min": -3.0,
        "train/advantages/max": 2.0,
        "train/advantages/first_token_abs_mean": (1.0 + 3.0 + 0.25) / 3,
        "train/token_mult_prob_error": sum(errors) / 8,
        "train/behaviour_ratio/mean": sum(ratios) / 8,
        "train/behaviour_ratio/min": min(ratios),
        "train/behaviour_ratio/max": max(ratios),
        "train/seq_mult_prob_error/mean": sum(seq) / 3,
        "train/seq_mult_prob_error/max": max(seq),
        "train/mean_gen_tokens_per_sample": 8 / 3,
        "train/truncation_rate": 1 / 3,
    }
    assert set(m) == set(want)
    for key, value in want.items():
        assert m[key].item() == pytest.approx(value, rel=1e-6), key


def test_the_reward_of_every_sample_without_a_scored_mask_and_advantages_over_the_trained_ones():
    e = _experience(sample_mask=torch.tensor([1.0, 0.0, 1.0]))
    m = rollout_metrics(from_dict({}), e, scored=None)
    assert m["train/reward"].item() == pytest.approx(0.5)
    assert m["train/advantages/min"].item() == 0.25 and m["train/advantages/max"].item() == 2.0  # row 1 left out


def test_each_filters_figures_appear_where_its_option_is_on():
    cfg = from_dict(
        {
            "policy": {"generation": {"max_new_tokens": 4}},
            "ppo": {"overlong_filtering": True, "overlong_shaping": {"buffer": 2, "factor": 1.0}},
            "loss": {"rollout_correction": {"seq_logprob_error_threshold": 1.1}, "kl": {"coef": 0.1}},
        }
    )
    weights = torch.where(MASK.bool(), 1.0, 0.0)
    e = _experience(is_weights=weights, ref_logprobs=_experience().old_logprobs)
    m = rollout_metrics(cfg, e, scored=None)
    assert m["train/num_masked_seqs_by_logprob_error"].item() == 2  # rows 0, 1: (1 + e^0.2) / 2 = 1.11; row 2: 1.05
    assert m["train/overlong/filtered_samples"].item() == 1
    assert m["train/overlong/shaped_samples"].item() == 1  # only the 4-token response passes 4 - 2 tokens
    assert m["train/overlong/penalty_mean"].item() == pytest.approx(-1.0 / 3)
    assert m["train/rollout_is/mean"].item() == 1.0 and m["train/rollout_is/capped_frac"].item() == 0.0
    assert m["train/kl_penalty"].item() == 0.0  # the reference is the policy
    assert not any(
        k.startswith(("train/overlong", "train/rollout_is", "train/kl"))
        for k in rollout_metrics(from_dict({}), _experience(), None)
    )


def test_staleness_and_the_generation_ranks_timings():
    rollout = Rollout([], _experience(), 2, {"timing/generation_wait": 0.5})
    assert staleness_metrics(rollout) == {
        "train/staleness/mean": 2.0,
        "train/staleness/max": 2.0,
        "timing/generation_wait": 0.5,
    }


def test_episode_figures_per_episode_and_none_for_single_turns():
    e = hand_episode()  # row 0: 2 turns, one observation of 3 tokens, turn rewards 0.5 and -1; row 1: 1 turn, cut
    m = episode_metrics(e)
    assert m["train/episodes/turns"] == 1.5 and m["train/episodes/tool_calls"] == 0.5
    assert m["train/episodes/observation_tokens"] == 1.5 and m["train/reward/env"] == -0.25
    assert m["train/episodes/ended_by/env_done"] == 0.5 and m["train/episodes/ended_by/truncated"] == 0.5
    assert m["train/episodes/ended_by/max_turns"] == 0.0
    assert episode_metrics(_experience()) == {}


def test_the_critics_fit_against_the_outcome_and_its_update():
    values = torch.where(MASK.bool(), torch.tensor([[0.0, 0.2, 0.4, 0.0]] * 3), NAN)
    returns = torch.where(MASK.bool(), 0.5, NAN)
    e = _experience(old_values=values, returns=returns)
    runs = [
        {"loss": torch.tensor(2.0), "vf_min": torch.tensor(0.1)},
        {"loss": torch.tensor(4.0), "vf_min": torch.tensor(-1.0)},
    ]
    m = critic_metrics(from_dict({}), e, runs, {"explained_var": torch.tensor(0.3)})
    assert m["train/critic/values_min"] == 0.0 and m["train/critic/values_max"] == pytest.approx(0.4)
    assert m["train/critic/returns_mean"] == 0.5 and m["train/critic/explained_var"] == pytest.approx(0.3)
    assert m["train/critic/loss"] == 3.0 and m["train/critic/vf_min"] == -1.0  # passes averaged, extremes kept
    outcome = outcome_returns(e.rewards, MASK, 1.0)
    assert torch.equal(m["train/critic/explained_var_outcome"], explained_var(outcome, values, MASK))


def test_timings_and_tokens_per_second():
    timer = PhaseTimer(torch.device("cpu"))
    timer.seconds = {"generation": 1.5, "reward": 0.5}
    m = timing_metrics(timer, _experience(), step_seconds=2.0)
    assert m["perf/tokens_per_sec"] == 11 / 2.0 and m["timing/generation"] == 1.5 and m["timing/step"] == 2.0
    assert "perf/tokens_per_sec" not in timing_metrics(timer, None, 2.0)


def test_a_trained_steps_metrics_gather_every_part():
    e = _experience()
    batch = ScoredBatch(Rollout([], e, 0, {}), {"gsm8k": 0.5}, {"train/dynamic_sampling/gen_batches": 2.0})
    runs = {"policy_update": [{"loss": torch.tensor(1.0)}, {"loss": torch.tensor(3.0)}]}
    m = train_metrics(from_dict({}), batch, e, runs, {})
    assert m["train/reward/gsm8k"] == 0.5 and m["train/dynamic_sampling/gen_batches"] == 2.0
    assert m["train/loss"] == 2.0 and m["train/staleness/max"] == 0.0 and "train/reward" in m
    assert not any(k.startswith("train/critic/") for k in m)  # no critic update in this step
