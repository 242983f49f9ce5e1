"""Episode batches (``build_episode_rows``) shared by the tests of episode rows, turn-level GAE, the advantage
estimators and the workers' losses: one written out by hand, so tests can assert numbers, and one of random tokens
with observations, with the poison checks the workers' tests run on it."""

from __future__ import annotations

import torch

from dtppo.config import Config
from dtppo.types import Experience, Segment, build_episode_rows
from tests.support.recipes import tiny_config

POISON = 1.0e4


def hand_episode() -> Experience:
    """Row 0: prompt [5, 6], action 1 [7, 8] (reward 0.5), observation [9, 9, 9], action 2 [10, 11, 12] (reward
    -1), ended by the environment. Row 1: prompt [5], one action [13, 14], truncated."""
    episodes = [
        [Segment([7, 8], 1, [-0.1, -0.2], 0.5), Segment([9, 9, 9], 1), Segment([10, 11, 12], 2, [-0.3] * 3, -1.0)],
        [Segment([13, 14], 1, [-0.4, -0.5])],
    ]
    return build_episode_rows([[5, 6], [5]], episodes, [0, 3], pad_id=0)


def observed_episodes() -> tuple[Experience, torch.Tensor]:
    """Two episodes of random tokens with observations between their turns (10 observation tokens), and where the
    observations are ([B, T] bool)."""
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


def loss_and_grads(worker, experience) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A worker's loss on ``experience`` and its parameters' gradients."""
    worker.model.zero_grad(set_to_none=True)
    loss, _ = worker.loss(experience)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in worker.model.named_parameters() if p.grad is not None}


def poisoned(e: Experience, where: torch.Tensor, fields) -> Experience:
    """``e`` with ``POISON`` in ``fields`` wherever ``where`` is True."""
    return e.replace(**{f: torch.where(where, POISON, getattr(e, f)) for f in fields})


def same(a, b) -> bool:
    """Whether two ``loss_and_grads`` results are equal exactly."""
    return torch.equal(a[0], b[0]) and a[1].keys() == b[1].keys() and all(torch.equal(a[1][k], b[1][k]) for k in a[1])


def workers_config(*extra: str) -> Config:
    """The tiny recipe shrunk for the workers' episode tests: 1-layer 32-wide models, 2 samples a step, a KL term."""
    small = [
        f"{w}.model.tiny.{k}={v}" for w in ("policy", "value") for k, v in [("hidden_size", 32), ("num_layers", 1)]
    ]
    keys = [
        "ppo.init_from_sft=false",
        "ppo.num_prompts_per_step=2",
        "policy.train_global_batch_size=2",
        "value.train_global_batch_size=2",
        "loss.kl.coef=0.1",
    ]
    return tiny_config(*small, *keys, *extra)


def workers_on_episodes() -> tuple:
    """(policy worker, value worker, episodes with noisy old log-probs, values, advantages and returns, the
    observation tokens' mask, the first action token's mask): what the workers' poison tests start from."""
    from dtppo.models.tokenizer import build_char_tokenizer
    from dtppo.workers.policy import PolicyWorker
    from dtppo.workers.value import ValueWorker

    cfg, tok = workers_config(), build_char_tokenizer()
    policy, value = PolicyWorker(cfg, tok), ValueWorker(cfg, tok)
    e, observation = observed_episodes()
    g = torch.Generator().manual_seed(1)

    def noise() -> torch.Tensor:
        return torch.randn(e.input_ids.shape, generator=g) * 0.1

    e = e.replace(
        old_logprobs=policy.get_logprobs(e) + noise(),
        ref_logprobs=policy.get_logprobs(e) + noise(),
        old_values=value.get_values(e) + noise(),
        advantages=noise(),
        returns=noise(),
    )
    first_action = e.response_mask.bool() & ~torch.roll(e.response_mask.bool(), 1, 1)
    return policy, value, e, observation, first_action
