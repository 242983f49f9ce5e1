"""The policy worker on episodes (``dtppo.workers.policy``): observation tokens condition everything and train
nothing, so poison in the policy's training tensors on observation tokens changes no loss and no gradient (the same
poison on an action token does). The critic's side: tests/unit/workers/test_value_episodes.py."""

from tests.support.episodes import loss_and_grads, poisoned, same, workers_on_episodes


def test_observation_tokens_are_in_no_policy_loss_and_no_gradient():
    policy, value, e, observation, first_action = workers_on_episodes()
    fields = ("old_logprobs", "ref_logprobs", "advantages", "gen_logprobs")
    clean = loss_and_grads(policy, e)
    assert same(clean, loss_and_grads(policy, poisoned(e, observation, fields)))
    assert not same(clean, loss_and_grads(policy, poisoned(e, first_action, fields)))  # the control
