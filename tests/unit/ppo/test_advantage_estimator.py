"""The advantage estimators (``dtppo.ppo.advantage_estimator``) against the pure functions they are built on: GAE with
the KL in the reward, V-trace from π_old/π_gen, turn rewards and the turn unit of episodes, GRPO on episode returns
and over the samples that train, the learning gate's fault hooks, and the choice ``build_estimator`` makes."""

import pytest
import torch

from dtppo.algorithms.advantages import (
    compute_advantages,
    compute_gae,
    compute_vtrace,
    group_normalized_advantages,
    token_level_rewards,
)
from dtppo.algorithms.kl import kl_k1
from dtppo.config import from_dict
from dtppo.faults import LEARNING_FAULT_ENV
from dtppo.ppo.advantage_estimator import GAEEstimator, GRPOEstimator, build_estimator
from dtppo.types import Experience
from tests.support.episodes import hand_episode
from tests.support.recipes import REPO

SCRIPTED = f"{REPO / 'tests' / 'support' / 'scripted_env.py'}:Scripted"
POISON = 1.0e6


def _experience(gen_shift: float = 0.0) -> Experience:
    """Four right-padded rows (one with a gap in its mask), values, and log-probs whose π_old/π_gen is <= 1."""
    g = torch.Generator().manual_seed(5)
    values, log_rho = torch.randn(4, 9, generator=g), 0.8 * torch.randn(4, 9, generator=g)
    mask = torch.zeros(4, 9)
    for b, (start, stop) in enumerate([(2, 9), (0, 4), (3, 6), (1, 8)]):
        mask[b, start:stop] = 1.0
    mask[3, 4] = 0.0
    old = -torch.rand(values.shape, generator=torch.Generator().manual_seed(6)) * mask
    return Experience(
        input_ids=torch.zeros(values.shape, dtype=torch.long),
        attention_mask=torch.ones(values.shape, dtype=torch.long),
        response_mask=mask,
        gen_logprobs=old + gen_shift * log_rho.abs() * mask,
        truncated=torch.zeros(4, dtype=torch.bool),
        rewards=torch.tensor([1.0, 0.0, 0.5, 1.0]),
        old_values=values,
        old_logprobs=old,
    )


def test_the_estimator_with_vtrace_uses_old_over_gen_and_equals_gae_on_policy():
    gae = GAEEstimator(1.0, 1.0, 1.0, True, 0.0, 0.0, "k3")
    vtrace = GAEEstimator(1.0, 1.0, 1.0, True, 0.0, 0.0, "k3", vtrace_caps=(1.0, 1.0))
    on_policy = _experience(0.0)
    a, b = gae(on_policy), vtrace(on_policy)
    assert torch.equal(a.advantages, b.advantages) and torch.equal(a.returns, b.returns)
    off_policy = _experience(1.0)
    c, d = gae(off_policy), vtrace(off_policy)
    assert torch.equal(c.returns, a.returns)  # GAE never looks at the ratios
    assert not torch.allclose(d.returns, c.returns)
    mask = off_policy.response_mask
    rewards = token_level_rewards(off_policy.rewards, mask)
    log_rho = off_policy.old_logprobs - off_policy.gen_logprobs
    assert torch.equal(d.returns, compute_vtrace(rewards, off_policy.old_values, log_rho, mask, 1.0, 1.0)[1])


def test_the_kl_in_the_reward_is_minus_its_coefficient_times_the_estimate_on_each_trained_token():
    e = _experience()
    ref = e.old_logprobs - 0.3 * e.response_mask  # log π_ref below log π_old on every response token
    e = e.replace(ref_logprobs=ref)
    out = GAEEstimator(0.9, 0.8, 1.0, False, 0.0, 0.05, "k1")(e)
    kl = kl_k1(e.old_logprobs, ref)
    assert torch.allclose(kl[e.response_mask.bool()], torch.full((int(e.response_mask.sum()),), 0.3), atol=1e-6)
    token_rewards = token_level_rewards(e.rewards, e.response_mask) - 0.05 * kl * e.response_mask
    want = compute_advantages(token_rewards, e.old_values, e.response_mask, 0.9, 0.8, 1.0, normalize=False)
    assert torch.equal(out.advantages, want[0]) and torch.equal(out.returns, want[1])
    # without the coefficient the KL is not read at all: a poisoned reference changes nothing
    plain = GAEEstimator(0.9, 0.8, 1.0, False, 0.0, 0.0, "k1")
    assert torch.equal(plain(e).advantages, plain(e.replace(ref_logprobs=torch.full_like(ref, POISON))).advantages)


def test_a_sample_left_out_of_training_gets_no_advantage_and_leaves_the_others_as_without_it():
    e = _experience()
    keep = torch.tensor([1.0, 0.0, 1.0, 1.0])
    out = GAEEstimator(1.0, 0.9, 0.9, False, 0.0, 0.0, "k3")(e.replace(sample_mask=keep))
    alone = GAEEstimator(1.0, 0.9, 0.9, False, 0.0, 0.0, "k3")(e)
    assert out.advantages[1].abs().sum() == 0 and out.returns[1].abs().sum() == 0
    assert torch.equal(out.advantages[[0, 2, 3]], alone.advantages[[0, 2, 3]])


@pytest.mark.parametrize("fault", ["drop_rewards", "zero_advantages"])
def test_the_learning_gates_faults_drop_the_reward_or_the_advantages(fault, monkeypatch):
    e = _experience()
    estimator = GAEEstimator(1.0, 0.95, 0.95, False, 0.0, 0.0, "k3")
    honest = estimator(e)
    monkeypatch.setenv(LEARNING_FAULT_ENV, fault)
    faulty = estimator(e)
    if fault == "zero_advantages":
        assert faulty.advantages.abs().sum() == 0 and torch.equal(faulty.returns, honest.returns)
    else:  # the returns are the critic's own values bootstrapped with no reward
        zero = compute_gae(torch.zeros_like(e.old_values), e.old_values, e.response_mask, 1.0, 0.95)
        assert torch.equal(faulty.advantages, zero[0]) and not torch.equal(faulty.returns, honest.returns)


def test_grpo_normalises_within_each_group_over_the_samples_that_train():
    e = _experience().replace(rewards=torch.tensor([1.0, 0.0, 0.0, 0.0]), sample_mask=torch.tensor([1.0, 1, 0, 1]))
    out = GRPOEstimator(2)(e)
    want = group_normalized_advantages(e.rewards, e.train_mask, 2, sample_mask=e.sample_mask)
    assert torch.equal(out.advantages, want)
    # group 0: ±1/√2 over its (unbiased) std; group 1 has one sample left: std 0, advantage 0
    first = out.advantages[0][e.response_mask[0].bool()]
    assert torch.allclose(first, torch.full_like(first, 0.5 / (0.5**0.5 + 1e-4)))
    assert out.advantages[2:].abs().sum() == 0
    assert out.returns is None


def _cfg(**ppo):
    return from_dict(
        {
            "ppo": {"num_prompts_per_step": 2, **ppo},
            "policy": {"train_global_batch_size": 2},
            "value": {"train_global_batch_size": 2},
            "env": {"class": SCRIPTED},
        }
    )


def test_build_estimator_chooses_gae_with_a_critic_and_grpo_without():
    gae = build_estimator(_cfg(gae={"gamma": 0.99, "lambda_policy": 0.95}))
    assert isinstance(gae, GAEEstimator) and (gae.gamma, gae.lambda_policy) == (0.99, 0.95)
    assert gae.kl_in_reward_coef == 0.0 and gae.vtrace_caps is None and not gae.per_turn
    grpo = build_estimator(_cfg(advantage_estimator="grpo", num_generations_per_prompt=2))
    assert grpo == GRPOEstimator(2)


def test_the_estimator_adds_turn_rewards_and_grpo_uses_episode_returns():
    e = hand_episode().replace(rewards=torch.tensor([1.0, -0.5]))
    torch.manual_seed(2)
    e = e.replace(old_values=torch.randn(e.input_ids.shape))
    est = build_estimator(_cfg(normalize_advantages=False))
    out = est(e)
    expected = compute_gae(
        token_level_rewards(e.rewards, e.response_mask) + e.step_rewards, e.old_values, e.response_mask, 1.0, 1.0
    )
    assert torch.equal(out.advantages, expected[0])
    # Without the turn rewards the advantages differ (the negative control).
    assert not torch.equal(est(e.replace(step_rewards=torch.zeros_like(e.step_rewards))).advantages, out.advantages)
    grpo = build_estimator(_cfg(advantage_estimator="grpo", num_generations_per_prompt=2))(e)
    returns = e.total_rewards  # 0.5 + 1.0 - 1.0 = 0.5 and -0.5
    assert returns.tolist() == [0.5, -0.5]
    assert grpo.advantages[0, 2] > 0 > grpo.advantages[1, 1]


def test_turn_unit_estimator_and_its_config_rules():
    e = hand_episode().replace(rewards=torch.tensor([1.0, -0.5]), old_values=torch.zeros(2, 10))
    out = build_estimator(_cfg(gae={"unit": "turn"}, normalize_advantages=False))(e)
    # Row 0: turn 2's advantage is its reward sum (1 - 1 = 0), turn 1's 0.5 + 0 (γ = λ = 1, V = 0).
    assert out.advantages[0].tolist() == [0, 0, 0.5, 0.5, 0, 0, 0, 0, 0, 0]
    with pytest.raises(Exception, match="ppo.gae.unit"):
        from_dict({"ppo": {"gae": {"unit": "turn"}}})
