"""The policy worker on episodes (``dtppo.workers.policy``): observation tokens condition everything and train
nothing, so poison in the policy's training tensors on observation tokens changes no loss and no gradient (the same
poison on an action token does). The critic's side: tests/unit/workers/test_value_episodes.py."""

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


def test_observation_tokens_are_in_no_policy_loss_and_no_gradient():
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
    fields = ("old_logprobs", "ref_logprobs", "advantages", "gen_logprobs")
    clean = loss_and_grads(policy, e)
    assert same(clean, loss_and_grads(policy, poisoned(e, observation, fields)))
    assert not same(clean, loss_and_grads(policy, poisoned(e, first_action, fields)))  # the control
