"""The value worker on episodes (``dtppo.workers.value``): poison in the critic's training tensors on observation tokens
changes no loss and no gradient (the same poison on an action token does), and V(s_t) at the first token after an
observation reads the head at the observation's last token, having seen it."""

import torch

from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.workers.value import ValueWorker
from tests.support.episodes import (
    loss_and_grads,
    observed_episodes,
    poisoned,
    same,
    workers_config,
    workers_on_episodes,
)


def test_observation_tokens_are_in_no_critic_loss_and_no_gradient():
    policy, value, e, observation, first_action = workers_on_episodes()
    fields = ("old_values", "returns")
    clean = loss_and_grads(value, e)
    assert same(clean, loss_and_grads(value, poisoned(e, observation, fields)))
    assert not same(clean, loss_and_grads(value, poisoned(e, first_action, fields)))  # the control


def test_the_value_after_an_observation_reads_the_observation():
    cfg, tok = workers_config(), build_char_tokenizer()
    value = ValueWorker(cfg, tok)
    e, observation = observed_episodes()
    values = value.get_values(e)
    # V(s_t) at turn 2's first action token: the head output at the observation's last token (the shift).
    row = 0
    t = int(((e.turn_ids[row] == 2) & e.response_mask[row].bool()).nonzero()[0])
    assert observation[row, t - 1]
    with torch.no_grad():
        head = value.model(e.input_ids, e.attention_mask)  # unshifted: position t has seen tokens 0..t
    assert torch.allclose(values[row, t], head[row, t - 1], atol=1e-6)
    assert not torch.allclose(values[row, t], head[row, t], atol=1e-4)  # the control: not the token it judges
    # Another observation changes V there and not at turn 1's tokens, which come before it.
    changed = e.input_ids.clone()
    changed[row, t - 1] = (changed[row, t - 1] + 1) % 90 + 3
    other = value.get_values(e.replace(input_ids=changed))
    assert other[row, t] != values[row, t]
    turn1 = (e.turn_ids[row] == 1) & e.response_mask[row].bool()
    assert torch.equal(other[row][turn1], values[row][turn1])
