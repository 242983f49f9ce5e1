"""Models the tensor-parallel plan does not know, under FSDP2 at dp=2: GPT-2 (sharded per transformer.h block) and
OPT (its model.decoder.layers are not looked for: sharded as one unit, the root) train exactly as in one process."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, OPTConfig, OPTForCausalLM

from dtppo.config import ParallelConfig
from dtppo.distributed.comm import rank
from dtppo.distributed.parallelize import decoder_layers
from dtppo.ops import logprobs_from_logits, weighted_sum
from dtppo.workers.layout import RankLayout
from tests.support.batches import synthetic_experience
from tests.support.harness import capture_first_gradients, full_state_dict, layout_updater, run
from tests.support.parity import FORWARD_TOL, assert_same_step

VOCAB = 50


def _model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":
        return GPT2LMHeadModel(
            GPT2Config(
                vocab_size=VOCAB,
                n_embd=32,
                n_layer=2,
                n_head=2,
                n_positions=64,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
            )
        )
    return OPTForCausalLM(
        OPTConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            ffn_dim=64,
            num_attention_heads=2,
            max_position_embeddings=64,
            word_embed_proj_dim=32,
            dropout=0.0,
            attention_dropout=0.0,
        )
    )


def layout_round(overrides: list[str], out_path: str) -> None:
    """One optimizer step of next-token NLL over a fixed batch, the model wrapped for this run's ranks (dropout off:
    its masks are drawn per rank)."""
    kind = overrides[0]
    world = int(overrides[-1].rpartition("=")[2])
    layout = RankLayout(ParallelConfig(), range(world))
    model = layout.wrap(_model(kind))
    engine = layout_updater(model, layout)
    initial, grads = full_state_dict(model), capture_first_gradients(model, engine.optimizer)

    def nll(micro):
        logits = model(input_ids=micro.input_ids, attention_mask=micro.attention_mask).logits
        return -weighted_sum(logprobs_from_logits(logits, micro.input_ids), micro.loss_weights), {}

    metrics = engine.train(synthetic_experience(VOCAB), nll, global_batch=8, micro_batch=2)
    result = {"loss": metrics["loss"], "grad_norm": metrics["grad_norm"], "weights": full_state_dict(model)}
    result |= {"initial": initial, "grads": grads}
    if rank() == 0:
        torch.save(result, out_path)


@pytest.mark.parametrize("kind, per_block", [("gpt2", True), ("opt", False)])
def test_fsdp_dp2_matches_one_process(kind, per_block):
    assert (decoder_layers(_model(kind)) is not None) == per_block
    single, sharded = run(layout_round, 1, [kind]), run(layout_round, 2, [kind])
    for key in ("loss", "grad_norm"):
        assert abs(float(single[key]) - float(sharded[key])) < FORWARD_TOL, key
    assert_same_step(single, sharded)
    assert float((single["weights"]["lm_head.weight"] - _model(kind).lm_head.weight).abs().max()) > 1e-4  # it trained
