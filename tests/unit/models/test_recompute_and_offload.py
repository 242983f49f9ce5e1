"""Activation checkpointing and CPU offload in one process: checkpointing gives the plain path's loss and gradients
while really recomputing each block, keeps the HF parameter names and is idle in eval; the generation replica is in
the compute dtype; cpu_offload without FSDP (a single CPU process) changes nothing. The sharded paths:
tests/distributed."""

import copy
import warnings

import pytest
import torch
from torch.distributed.fsdp import FSDPModule
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Model

from dtppo.config import ParallelConfig
from dtppo.distributed import parallelize
from dtppo.distributed.parallelize import decoder_layers
from dtppo.models.logprobs import token_logprobs
from dtppo.models.recompute import recompute_blocks
from dtppo.models.value import ValueModel
from dtppo.ops import masked_sum
from dtppo.workers.layout import RankLayout

LAYERS = 3


def _model(role: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        tie_word_embeddings=True,
    )
    config._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(config) if role == "policy" else ValueModel(Qwen2Model(config), seed=0)


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (3, 12), generator=g)
    attention = torch.ones_like(ids)
    attention[0, 9:] = 0  # a padded row
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, 5:] = True
    return ids, attention, mask & attention.bool(), torch.randn(ids.shape, generator=g)


def _loss(role: str, model, ids, attention, mask, target) -> torch.Tensor:
    if role == "policy":
        return -masked_sum(token_logprobs(model, ids, attention, mask, 0.7, 4) * target, mask)
    return masked_sum((model.values(ids, attention) - target) ** 2, mask)


def _step(role: str, model) -> tuple[torch.Tensor, dict[str, torch.Tensor], int, int]:
    """Loss, gradients, and the blocks' forward calls during forward and during backward."""
    calls = [0]
    hooks = [
        layer.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        for layer in decoder_layers(model)
    ]
    model.train()
    loss = _loss(role, model, *_batch())
    in_forward = calls[0]
    loss.backward()
    for hook in hooks:
        hook.remove()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}, in_forward, calls[0] - in_forward


@pytest.mark.parametrize("role", ["policy", "critic"])
def test_activation_checkpointing_gives_the_same_loss_and_gradients_and_recomputes_each_block(role):
    plain, checkpointed = _model(role), _model(role)
    names = [n for n, _ in plain.named_parameters(remove_duplicate=False)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecation from transformers' switch
        recompute_blocks(checkpointed)
    # nothing renamed: checkpoints, HF export, tied names and the vLLM refit use these names
    assert [n for n, _ in checkpointed.named_parameters(remove_duplicate=False)] == names
    assert list(checkpointed.state_dict()) == list(plain.state_dict())
    loss, grads, forward, backward = _step(role, plain)
    loss_ac, grads_ac, forward_ac, backward_ac = _step(role, checkpointed)
    assert float(loss) != 0.0 and float(loss_ac) == float(loss)
    assert grads.keys() == grads_ac.keys()
    assert max(float((grads[n] - grads_ac[n]).abs().max()) for n in grads) == 0.0
    assert min(float(g.abs().max()) for g in grads.values()) > 0.0  # every parameter got a gradient
    assert (forward, backward) == (LAYERS, 0)
    assert (forward_ac, backward_ac) == (LAYERS, LAYERS)  # negative control: each block ran again in backward


def test_activation_checkpointing_keeps_nothing_to_recompute_in_eval():
    model = recompute_blocks(_model("policy")).eval()
    ids, attention, mask, _ = _batch()
    calls = [0]
    for layer in decoder_layers(model):
        layer.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    with torch.no_grad():
        expected = token_logprobs(_model("policy").eval(), ids, attention, mask, 0.7, 4)
        assert torch.equal(token_logprobs(model, ids, attention, mask, 0.7, 4), expected)
    assert calls[0] == LAYERS


def test_recompute_refuses_a_module_without_a_transformers_model():
    with pytest.raises(ValueError, match="holds no transformers model"):
        recompute_blocks(torch.nn.Linear(2, 2))


def test_the_generation_replica_follows_the_one_compute_dtype(monkeypatch):
    layout = RankLayout(ParallelConfig())
    model = _model("policy")
    replica = layout.replica(model)
    assert parallelize.compute_dtype() == torch.float32 and parallelize.mixed_precision().param_dtype is None
    assert {p.dtype for p in replica.parameters()} == {torch.float32}
    assert not any(p.requires_grad for p in replica.parameters()) and not replica.training
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # what a GPU rank sees; the device stays CPU
    assert parallelize.compute_dtype() == torch.bfloat16
    assert parallelize.mixed_precision().param_dtype == torch.bfloat16
    assert parallelize.mixed_precision().reduce_dtype == torch.float32
    replica = layout.replica(model)
    assert {p.dtype for p in replica.parameters()} == {torch.bfloat16}
    assert replica.lm_head.weight is replica.model.embed_tokens.weight  # still tied: one bf16 copy
    assert replica.model.rotary_emb.inv_freq.dtype == torch.float32  # buffers as under FSDP2's mixed precision
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the source is untouched
    # a refit (load_state_dict of fp32 weights) casts into the replica
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    replica.load_state_dict(model.state_dict())
    assert replica.lm_head.weight.dtype == torch.bfloat16
    assert torch.equal(replica.lm_head.weight, model.lm_head.weight.to(torch.bfloat16))


def test_cpu_offload_without_fsdp_changes_nothing():
    """A single CPU process is not FSDP-wrapped: parameters, gradients and optimizer state are in host memory
    already, so ``cpu_offload`` is a documented no-op there (``PolicyConfig.cpu_offload``)."""
    layout = RankLayout(ParallelConfig())
    assert not layout.sharded
    model = _model("critic")
    expected = copy.deepcopy(model.state_dict())
    wrapped = layout.wrap(model, cpu_offload=True)
    assert wrapped is model and not isinstance(wrapped, FSDPModule)
    assert all(type(p.data) is torch.Tensor and p.device.type == "cpu" for p in wrapped.parameters())
    assert all(torch.equal(v, expected[k]) for k, v in wrapped.state_dict().items())
