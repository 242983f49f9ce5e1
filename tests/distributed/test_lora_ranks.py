"""LoRA on the policy and the critic (fp32, gloo), in one process and under FSDP2 at dp=2 (also with activation
checkpointing and CPU offload): they agree; the reference is the base with its adapters off and equals a separately
built base model; the generator refitted after an update computes the trainer's log-probs; only adapters and the
value head train."""

import pytest
import torch

from dtppo.distributed.comm import rank
from dtppo.models.causal_lm import build_policy
from dtppo.models.logprobs import token_logprobs
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.workers.value import ValueWorker
from tests.support.batches import synthetic_experience
from tests.support.harness import full_state_dict, make_config, run, worker_results
from tests.support.parity import FORWARD_TOL, assert_same_update

TOL = FORWARD_TOL  # log-probs of two models holding the same weights (tests/support/parity.py)
# Both models adapted; a KL term so the reference is used; a learning rate that moves the adapters visibly in
# one step. Dropout is off in the workers' models; the adapters' own dropout is 0 by default.
LORA = [
    "policy.lora.rank=4",
    "value.lora.rank=4",
    "loss.kl.coef=0.1",
    "policy.optimizer.lr=1e-2",
    "value.optimizer.lr=1e-2",
    "policy.train_micro_batch_size=2",
    "value.train_micro_batch_size=2",
]


def _inspect(policy, value) -> dict:
    """After the update and the refit: log-probs of the trainer, of the generator, of the reference, and of the
    base rebuilt from scratch (a separately built model: no adapters, the same seed)."""
    cfg, tok = policy.cfg, policy.tokenizer
    exp = synthetic_experience(len(tok))
    mask = exp.response_mask.bool()
    generator = token_logprobs(policy.generator.model, exp.input_ids, exp.attention_mask, mask, 1.0, 128)
    with torch.no_grad():
        base = token_logprobs(
            build_policy(cfg.policy_init_path, cfg.policy.model.tiny, cfg.ppo.seed, tok),
            exp.input_ids,
            exp.attention_mask,
            mask,
            1.0,
            128,
        )
    return {
        "trainer_after": policy.get_logprobs(exp),
        "generator_after": generator * exp.attention_mask,
        "reference_after": policy.get_reference_logprobs(exp),
        "base": base * exp.attention_mask,
        "trainable": {
            "policy": sorted(n for n, p in policy.model.named_parameters() if p.requires_grad),
            "value": sorted(n for n, p in value.model.named_parameters() if p.requires_grad),
        },
        "optimizer_states": {
            "policy": len(policy.updater.optimizer.state),
            "value": len(value.updater.optimizer.state),
        },
    }


def lora_round(overrides: list[str], out_path: str) -> None:
    result = worker_results(overrides, _inspect)
    if rank() == 0:
        torch.save(result, out_path)


FLAGS = [f"{w}.{k}=true" for w in ("policy", "value") for k in ("activation_checkpointing", "cpu_offload")]


@pytest.fixture(scope="module")
def results():
    return {1: run(lora_round, 1, LORA), 2: run(lora_round, 2, LORA), "flags": run(lora_round, 2, LORA + FLAGS)}


def _diff(a, b) -> float:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        return max(_diff(a[k], b[k]) for k in a)
    return float((a.float() - b.float()).abs().max())


def test_dp2_matches_one_process(results):
    """The adapters' gradients and their update as a whole (Adam's first step on a LoRA B entry whose gradient is
    near eps moves it by a sizeable share of lr = 1e-2 on a float32 difference; tests/support/parity.py)."""
    one, two = results[1], results[2]
    assert_same_update(one, two, check_replica=False)  # the refit merges the adapters: a test of its own below
    for key in ("ref_logprobs", "trainer_after"):
        assert _diff(one[key], two[key]) < TOL, key


def test_activation_checkpointing_and_cpu_offload_change_nothing(results):
    plain, flags = results[2], results["flags"]
    for key in ("values", "logprobs", "ref_logprobs", "policy_weights", "value_weights", "generator_after"):
        assert _diff(plain[key], flags[key]) == 0.0, key


@pytest.mark.parametrize("world", [1, 2])
def test_the_refitted_generator_computes_the_trainers_logprobs(results, world):
    got = results[world]
    assert _diff(got["generator_after"], got["trainer_after"]) <= TOL
    # Negative control: the base alone (an unmerged refit) is far from the trained policy.
    assert _diff(got["base"], got["trainer_after"]) > 1e-2


@pytest.mark.parametrize("world", [1, 2])
def test_the_reference_is_the_base_model_before_and_after_the_update(results, world):
    got = results[world]
    assert _diff(got["ref_logprobs"], got["base"]) <= TOL
    assert _diff(got["reference_after"], got["base"]) <= TOL
    assert _diff(got["ref_logprobs"], got["logprobs"]) == 0.0  # a fresh adapter (B = 0) changes nothing


@pytest.mark.parametrize("world", [1, 2])
def test_only_adapters_and_the_value_head_train(results, world):
    got = results[world]
    trainable = got["trainable"]
    assert all(".lora_A." in n or ".lora_B." in n for n in trainable["policy"])
    assert {"score.weight", "score.bias"} <= set(trainable["value"])
    assert all(".lora_" in n or n.startswith("score.") for n in trainable["value"])
    assert got["optimizer_states"] == {"policy": len(trainable["policy"]), "value": len(trainable["value"])}


def test_the_value_head_and_the_adapters_move_and_the_base_does_not(results):
    cfg = make_config(LORA)
    tok = build_char_tokenizer()
    fresh = full_state_dict(ValueWorker(cfg, tok).model)
    trained = results[2]["value_weights"]
    assert _diff(trained["score.weight"], fresh["score.weight"]) > 1e-3
    assert max(_diff(trained[k], fresh[k]) for k in trained if ".lora_B." in k) > 1e-3
    assert max(_diff(trained[k], fresh[k]) for k in trained if ".base_layer." in k) == 0.0
