"""The value worker on episodes (``dtppo.workers.value``): poison in the critic's training tensors on observation tokens
changes no loss and no gradient (the same poison on an action token does), and V(s_t) at the first token after an
observation reads the head at the observation's last token, having seen it."""

import torch

from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.workers.policy import PolicyWorker
from dtppo.workers.value import ValueWorker
from tests.support.episodes import loss_and_grads, observed_episodes, poisoned, same
from tests.support.recipes import tiny_config

SMALL = [f"{w}.model.tiny.{k}={v}" for w in ("policy", "value") for k, v in [("hidden_size", 32), ("num_layers", 1)]]


def _config(*extra):
    keys = [
        "ppo.init_from_sft=false",
        "ppo.num_prompts_per_step=2",
        "policy.train_global_batch_size=2",
        "value.train_global_batch_size=2",
        "loss.kl.coef=0.1",
        *extra,
    ]
    return tiny_config(*SMALL, *keys)


def test_observation_tokens_are_in_no_critic_loss_and_no_gradient():
    cfg, tok = _config(), build_char_tokenizer()
    policy, value = PolicyWorker(cfg, tok), ValueWorker(cfg, tok)
    e, observation = observed_episodes()
    g = torch.Generator().manual_seed(1)
    noise = lambda: torch.randn(e.input_ids.shape, generator=g) * 0.1  # noqa: E731
    e = e.replace(
        old_logprobs=policy.get_logprobs(e) + noise(),
        ref_logprobs=policy.get_logprobs(e) + noise(),
        old_values=value.get_values(e) + noise(),
        advantages=noise(),
        returns=noise(),
    )
    first_action = e.response_mask.bool() & ~torch.roll(e.response_mask.bool(), 1, 1)
    fields = ("old_values", "returns")
    clean = loss_and_grads(value, e)
    assert same(clean, loss_and_grads(value, poisoned(e, observation, fields)))
    assert not same(clean, loss_and_grads(value, poisoned(e, first_action, fields)))  # the control


def test_the_value_after_an_observation_reads_the_observation():
    cfg, tok = _config(), build_char_tokenizer()
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
