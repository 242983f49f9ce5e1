"""Observation tokens condition everything and train nothing: poison in the training tensors on observation tokens
changes no policy or critic loss and no gradient (the same poison on an action token does), and the critic's V(s_t)
at the first token after an observation reads the head at the observation's last token, having seen it."""

import torch

from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.types import Segment, build_episode_rows
from dtppo.workers.policy import PolicyWorker
from dtppo.workers.value import ValueWorker
from tests.support.recipes import tiny_config

SMALL = [f"{w}.model.tiny.{k}={v}" for w in ("policy", "value") for k, v in [("hidden_size", 32), ("num_layers", 1)]]
POISON = 1.0e4


def _config(*extra):
    keys = [
        "ppo.init_from_sft=false",
        "ppo.num_prompts_per_step=2",
        "policy.train_global_batch_size=2",
        "value.train_global_batch_size=2",
        "loss.kl_coef=0.1",
        *extra,
    ]
    return tiny_config(*SMALL, *keys)


def _episodes():
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(3, 90, (n,), generator=g).tolist()  # noqa: E731
    segs = [
        [Segment(ids(4), 1, [-1.0] * 4), Segment(ids(5), 1), Segment(ids(3), 2, [-1.0] * 3)],
        [
            Segment(ids(6), 1, [-1.0] * 6),
            Segment(ids(2), 1),
            Segment(ids(2), 2, [-1.0] * 2),
            Segment(ids(3), 2),
            Segment(ids(4), 3, [-1.0] * 4),
        ],
    ]
    e = build_episode_rows([ids(3), ids(5)], segs, [0, 0], pad_id=0)
    observation = e.attention_mask.bool() & (e.turn_ids > 0) & ~e.response_mask.bool()
    assert observation.sum() == 10
    return e, observation


def _loss_and_grads(worker, experience):
    worker.model.zero_grad(set_to_none=True)
    loss, _ = worker.loss(experience)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in worker.model.named_parameters() if p.grad is not None}


def _poison(e, where, fields):
    return e.replace(**{f: torch.where(where, POISON, getattr(e, f)) for f in fields})


def _same(a, b):
    return torch.equal(a[0], b[0]) and a[1].keys() == b[1].keys() and all(torch.equal(a[1][k], b[1][k]) for k in a[1])


def test_observation_tokens_are_in_no_policy_or_critic_loss_and_no_gradient():
    cfg, tok = _config(), build_char_tokenizer()
    policy, value = PolicyWorker(cfg, tok), ValueWorker(cfg, tok)
    e, observation = _episodes()
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
    for worker, fields in [
        (policy, ("old_logprobs", "ref_logprobs", "advantages", "gen_logprobs")),
        (value, ("old_values", "returns")),
    ]:
        clean = _loss_and_grads(worker, e)
        assert _same(clean, _loss_and_grads(worker, _poison(e, observation, fields)))
        assert not _same(clean, _loss_and_grads(worker, _poison(e, first_action, fields)))  # the control


def test_the_value_after_an_observation_reads_the_observation():
    cfg, tok = _config(), build_char_tokenizer()
    value = ValueWorker(cfg, tok)
    e, observation = _episodes()
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
