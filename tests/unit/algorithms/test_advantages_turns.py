"""GAE over a multi-turn episode's action tokens only (per token and per turn) against float64 loops: observation
tokens are skipped as if absent, so poison on them changes nothing (the same poison on an action token does)."""

import torch

from dtppo.algorithms.advantages import compute_gae, compute_turn_gae, token_level_rewards, turn_starts
from dtppo.types import Experience
from tests.support.episodes import hand_episode

POISON = 1.0e6


def _gae_loop(rewards, values, mask, gamma, lam):
    """float64 GAE over the valid tokens of each row only (observations skipped), as a list walk."""
    adv = torch.zeros_like(rewards, dtype=torch.float64)
    for b in range(rewards.shape[0]):
        idx = [t for t in range(rewards.shape[1]) if mask[b, t]]
        running, next_v = 0.0, 0.0
        for k in reversed(range(len(idx))):
            t = idx[k]
            last = k == len(idx) - 1
            delta = float(rewards[b, t]) + (0.0 if last else gamma * next_v) - float(values[b, t])
            running = delta + (0.0 if last else gamma * lam * running)
            adv[b, t], next_v = running, float(values[b, t])
    return adv


def test_gae_runs_over_action_tokens_only_and_observation_poison_changes_nothing():
    e = hand_episode()
    torch.manual_seed(0)
    values = torch.randn(e.input_ids.shape)
    token_rewards = token_level_rewards(torch.tensor([1.0, -0.5]), e.response_mask) + e.step_rewards
    adv, ret = compute_gae(token_rewards, values, e.response_mask, 0.9, 0.8)
    ref = _gae_loop(token_rewards.double(), values.double(), e.response_mask.bool(), 0.9, 0.8)
    assert torch.allclose(adv.double(), ref, atol=1e-6)
    assert torch.equal(ret, torch.where(e.response_mask.bool(), adv + values, 0.0))
    observation = e.attention_mask.bool() & (e.turn_ids > 0) & ~e.response_mask.bool()
    poisoned = compute_gae(
        torch.where(observation, POISON, token_rewards),
        torch.where(observation, POISON, values),
        e.response_mask,
        0.9,
        0.8,
    )
    assert torch.equal(poisoned[0], adv) and torch.equal(poisoned[1], ret)
    # Negative control: the same poison on an action token does change the advantages.
    action_poisoned = compute_gae(
        token_rewards,
        values.index_put((torch.tensor([0]), torch.tensor([7])), torch.tensor(POISON)),
        e.response_mask,
        0.9,
        0.8,
    )
    assert not torch.equal(action_poisoned[0], adv)


def _turn_gae_loop(e: Experience, token_rewards, values, gamma, lam):
    """float64: one GAE step per turn (value at its first action token, its tokens' rewards summed)."""
    adv = torch.zeros(e.input_ids.shape, dtype=torch.float64)
    ret = torch.zeros_like(adv)
    for b in range(e.batch_size):
        turns = sorted({int(t) for t, m in zip(e.turn_ids[b], e.response_mask[b]) if m})
        tokens = {
            k: [t for t in range(e.input_ids.shape[1]) if e.response_mask[b, t] and e.turn_ids[b, t] == k]
            for k in turns
        }
        v = {k: float(values[b, tokens[k][0]]) for k in turns}
        r = {k: sum(float(token_rewards[b, t]) for t in tokens[k]) for k in turns}
        running = 0.0
        for i in reversed(range(len(turns))):
            k = turns[i]
            last = i == len(turns) - 1
            delta = r[k] + (0.0 if last else gamma * v[turns[i + 1]]) - v[k]
            running = delta + (0.0 if last else gamma * lam * running)
            for t in tokens[k]:
                adv[b, t], ret[b, t] = running, running + v[k]
    return adv, ret


def test_turn_level_gae_against_a_float64_loop():
    e = hand_episode()
    torch.manual_seed(1)
    values = torch.randn(e.input_ids.shape)
    token_rewards = token_level_rewards(torch.tensor([1.0, -0.5]), e.response_mask) + e.step_rewards
    token_rewards = token_rewards + 0.01 * e.response_mask  # a reward on every action token: sums per turn
    assert turn_starts(e.response_mask, e.turn_ids).nonzero().tolist() == [[0, 2], [0, 7], [1, 1]]
    adv, ret = compute_turn_gae(token_rewards, values, e.response_mask, e.turn_ids, 0.9, 0.7)
    ref_adv, ref_ret = _turn_gae_loop(e, token_rewards.double(), values.double(), 0.9, 0.7)
    assert torch.allclose(adv.double(), ref_adv, atol=1e-6)
    assert torch.allclose(ret.double(), ref_ret, atol=1e-6)
