"""Activation checkpointing and CPU offload against the plain path on 2 gloo ranks, all in one
launch: a policy-shaped causal LM (through the chunked log-prob head, ``models.logprobs``) and a critic
(ValueModel), two optimizer steps each, at dp=2 (FSDP2) and at tp=2 with sequence parallelism; then the real
workers built with both flags on against the plain workers. Every case is a fresh, identically seeded model.

The flags change where tensors live and when activations are computed, never the arithmetic: every comparison is
exact (0.0), and each has a control that fails if a flag silently did nothing."""

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import FSDPModule
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Model

from dtppo.config import ParallelConfig
from dtppo.distributed.comm import rank
from dtppo.distributed.parallelize import decoder_layers
from dtppo.models.logprobs import token_logprobs
from dtppo.models.value import ValueModel
from dtppo.ops import weighted_sum
from dtppo.workers.layout import RankLayout
from dtppo.workers.updater import Updater
from tests.support.batches import synthetic_experience
from tests.support.harness import full_state_dict, layout_updater, run, worker_results

VOCAB, LAYERS = 64, 2
# name: (activation_checkpointing, cpu_offload, unsharded_grad_accumulation)
CASES = {
    "dp": {
        "plain": (False, False, True),
        "ac": (True, False, True),
        "offload": (False, True, True),
        "plain_per_micro": (False, False, False),
        "offload_per_micro": (False, True, False),
    },
    "tp": {"plain": (False, False, True), "ac": (True, False, True)},
}
# Rows per microbatch: dp=2 gives each rank 2 of a step's 4 rows, tp=2 all 4 (and its collectives are slow on gloo).
MICRO = {"dp": 1, "tp": 2}
# Block forwards per rank over the 2 steps: each microbatch's forward runs every block once; under AC, backward again.
FORWARDS = {"dp": LAYERS * 2 * 2, "tp": LAYERS * 2 * 2}
WORKER_FLAGS = [f"{w}.{k}=true" for w in ("policy", "value") for k in ("activation_checkpointing", "cpu_offload")]
WORKER_BASE = ["policy.train_micro_batch_size=2", "value.train_micro_batch_size=2", "loss.kl.coef=0.05"]


def _model(role: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        tie_word_embeddings=True,
    )
    config._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(config) if role == "policy" else ValueModel(Qwen2Model(config), seed=0)


def _loss_fn(role: str, model: torch.nn.Module):
    def loss(micro):
        mask = micro.response_mask
        if role == "policy":
            logprobs = token_logprobs(model, micro.input_ids, micro.attention_mask, mask.bool(), 1.0, 8)
            return -weighted_sum(logprobs * micro.advantages, micro.loss_weights), {}
        values = model.values(micro.input_ids, micro.attention_mask)
        return weighted_sum((values - micro.returns) ** 2, micro.loss_weights), {}

    return loss


def _engine(role: str, layout: RankLayout, ac: bool, offload: bool, unsharded: bool) -> Updater:
    model = layout.wrap(_model(role), activation_checkpointing=ac, cpu_offload=offload)
    return layout_updater(model, layout, unsharded_accumulation=unsharded)


def _offload_policies(model: torch.nn.Module) -> set[str]:
    """The offload policy of every FSDP unit, by class name (a test-only look at FSDP2's internals: on a CPU-only
    machine offloading moves nothing, so this is how a test sees that the flag reached every unit)."""
    return {
        type(m._get_fsdp_state()._fsdp_param_group.offload_policy).__name__
        for m in model.modules()
        if isinstance(m, FSDPModule)
    }


def _train_case(
    role: str, layout: RankLayout, micro: int, flags: tuple[bool, bool, bool], resume_in: Path | None
) -> dict:
    """Two optimizer steps of 4 rows; counts the decoder blocks' forward calls. With ``resume_in``, the state then
    goes through DCP there and back into a fresh engine of the same flags, which must take the same next step as
    the original."""
    engine = _engine(role, layout, *flags)
    calls = [0]
    for layer in decoder_layers(engine.model):
        layer.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    exp = synthetic_experience(VOCAB)
    metrics = engine.train(exp, _loss_fn(role, engine.model), global_batch=4, micro_batch=micro)
    result = {
        "loss": metrics["loss"],
        "grad_norm": metrics["grad_norm"],
        "weights": full_state_dict(engine.model),
        "block_calls": calls[0],
        "offload_policies": _offload_policies(engine.model),
    }
    if resume_in is not None:
        dcp.save(engine.state_dict(), checkpoint_id=str(resume_in / role))
        restored = _engine(role, layout, *flags)
        state = restored.state_dict()
        dcp.load(state, checkpoint_id=str(resume_in / role))
        restored.load_state_dict(state)
        resumed = [e.train(exp, _loss_fn(role, e.model), global_batch=8, micro_batch=2) for e in (engine, restored)]
        result |= {
            "resumed_loss": [float(m["loss"]) for m in resumed],
            "resumed_weights": [full_state_dict(engine.model), full_state_dict(restored.model)],
        }
    return result


def features_round(overrides: list[str], out_path: str) -> None:
    """Every case of both layouts for both roles, then the workers plain and with both flags; rank 0 saves."""
    tmp = Path(out_path).parent
    results = {}
    for name, parallel in (("dp", ParallelConfig()), ("tp", ParallelConfig(tp=2, sequence_parallel=True))):
        layout = RankLayout(parallel, range(2))
        for role in ("policy", "critic"):
            for case, flags in CASES[name].items():
                resume_in = tmp if (name, case) == ("dp", "offload") else None
                results[(name, role, case)] = _train_case(role, layout, MICRO[name], flags, resume_in)
    for case, flags in (("plain", []), ("flags", WORKER_FLAGS)):
        results[("workers", case)] = worker_results([*WORKER_BASE, *flags, *overrides], _worker_state)
    if rank() == 0:
        torch.save(results, out_path)


def _worker_state(policy, value) -> dict:
    models = {"policy": policy.model, "reference": policy.reference, "value": value.model}
    return {
        "offload": {name: _offload_policies(m) for name, m in models.items()},
        "checkpointing": {
            "policy": policy.model.is_gradient_checkpointing,
            "reference": policy.reference.is_gradient_checkpointing,
            "replica": policy.generator.model.is_gradient_checkpointing,
            "value": value.model.backbone.is_gradient_checkpointing,
        },
    }


@pytest.fixture(scope="module")
def results():
    return run(features_round, 2, [])


def _weights_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _diffs(ref: dict, got: dict) -> dict:
    return {
        "loss": abs(float(ref["loss"] - got["loss"])),
        "grad_norm": abs(float(ref["grad_norm"] - got["grad_norm"])),
        "weights": _weights_diff(ref["weights"], got["weights"]),
    }


EXACT = {"loss": 0.0, "grad_norm": 0.0, "weights": 0.0}


@pytest.mark.parametrize("role", ["policy", "critic"])
@pytest.mark.parametrize("layout", ["dp", "tp"])
def test_activation_checkpointing_matches_plain_and_recomputes(results, layout, role):
    plain, ac = results[(layout, role, "plain")], results[(layout, role, "ac")]
    assert _diffs(plain, ac) == EXACT  # the recompute repeats the same ops in the same order
    assert plain["block_calls"] == FORWARDS[layout] and ac["block_calls"] == 2 * FORWARDS[layout]  # AC is on
    fresh = {k: v.detach() for k, v in _model(role).state_dict().items()}
    assert _weights_diff(plain["weights"], fresh) > 1e-3  # the steps changed the weights


@pytest.mark.parametrize("role", ["policy", "critic"])
@pytest.mark.parametrize("offload, reference", [("offload", "plain"), ("offload_per_micro", "plain_per_micro")])
def test_cpu_offload_matches_plain_at_dp2(results, role, offload, reference):
    got, ref = results[("dp", role, offload)], results[("dp", role, reference)]
    assert _diffs(ref, got) == EXACT
    assert got["offload_policies"] == {"CPUOffloadPolicy"} and ref["offload_policies"] == {"OffloadPolicy"}


@pytest.mark.parametrize("role", ["policy", "critic"])
def test_offloaded_state_round_trips_through_dcp(results, role):
    got = results[("dp", role, "offload")]
    original, restored = got["resumed_loss"]
    assert original == restored
    assert _weights_diff(*got["resumed_weights"]) == 0.0  # the optimizer state came back too
    assert _weights_diff(got["resumed_weights"][0], got["weights"]) > 1e-4  # the resumed step did move


def test_workers_with_both_flags_match_plain_workers(results):
    """PolicyWorker and ValueWorker built with activation_checkpointing and cpu_offload (reference model included):
    inference, one update, the refit of the torch replica and what the vLLM refit would stream."""
    plain, flags = results[("workers", "plain")], results[("workers", "flags")]
    for key in ("values", "logprobs", "ref_logprobs"):
        assert float((plain[key] - flags[key]).abs().max()) == 0.0, key
    for metrics in ("policy_metrics", "value_metrics"):
        for key in ("loss", "grad_norm"):
            assert float(plain[metrics][key]) == float(flags[metrics][key]), (metrics, key)
    for key in ("policy_weights", "value_weights", "rollout_weights"):
        assert _weights_diff(plain[key], flags[key]) == 0.0, key
    assert _weights_diff(flags["policy_weights"], flags["rollout_weights"]) == 0.0  # the replica was refit
    streamed = flags["streamed_weights"]
    assert streamed.keys() == flags["rollout_weights"].keys()
    assert _weights_diff(streamed, flags["rollout_weights"]) == 0.0
    # the flags reached the models (and only those: the frozen copies have no AC, nothing to recompute for)
    assert flags["offload"] == {m: {"CPUOffloadPolicy"} for m in ("policy", "reference", "value")}
    assert plain["offload"] == {m: {"OffloadPolicy"} for m in ("policy", "reference", "value")}
    assert flags["checkpointing"] == {"policy": True, "reference": False, "replica": False, "value": True}
    assert not any(plain["checkpointing"].values())
