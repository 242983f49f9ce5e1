"""Every loss aggregation mode gives the same update at dp=2 (FSDP2, each rank a different share of tokens and
sequences) as in one process, microbatches of 1 or of a rank's whole share, or of at most 20 tokens (each rank
groups its own rows: their counts differ until the ranks split to the same number)."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from dtppo.config import ParallelConfig
from dtppo.distributed.comm import rank
from dtppo.models.logprobs import token_logprobs
from dtppo.ops import weighted_sum
from dtppo.workers.layout import RankLayout
from tests.support.batches import synthetic_experience
from tests.support.harness import capture_first_gradients, full_state_dict, layout_updater, run
from tests.support.parity import FORWARD_TOL, GRAD_RTOL, assert_same_step, relative_gradient_diff

VOCAB = 50
BUDGET = 20  # tokens per microbatch: rows hold 5 to 18, rank 0 groups 3 microbatches, rank 1 4
MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    dropout_off = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}  # its masks are drawn per rank
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64, **dropout_off))


def aggregation_round(overrides: list[str], out_path: str) -> None:
    """One optimizer step of a policy-gradient loss per mode and microbatch size, from the same weights."""
    world = int(overrides[-1].rpartition("=")[2])
    layout = RankLayout(ParallelConfig(), range(world))
    experience = synthetic_experience(VOCAB)
    results = {}
    for mode in MODES:
        for micro, budget in ((1, None), (8 // world, None), (8 // world, BUDGET)):
            model = layout.wrap(_model())
            engine = layout_updater(model, layout, max_grad_norm=100.0, aggregation=mode, horizon=16)
            initial, grads = full_state_dict(model), capture_first_gradients(model, engine.optimizer)

            def loss(micro_batch, model=model):
                mask = micro_batch.response_mask.bool()
                logprobs = token_logprobs(model, micro_batch.input_ids, micro_batch.attention_mask, mask, 1.0, 8)
                return -weighted_sum(logprobs * micro_batch.advantages, micro_batch.loss_weights), {}

            metrics = engine.train(experience, loss, global_batch=8, micro_batch=micro, max_tokens=budget)
            weights = full_state_dict(model)
            results[f"{mode}/{budget or micro}"] = {"loss": metrics["loss"], "weights": weights, "grads": grads}
            results["initial"] = initial
    if rank() == 0:
        torch.save(results, out_path)


def test_every_mode_matches_one_process_at_dp2_and_any_microbatching():
    single, sharded = run(aggregation_round, 1, []), run(aggregation_round, 2, [])
    for mode in MODES:
        base = single[f"{mode}/8"] | {"initial": single["initial"]}
        runs = [single[f"{mode}/1"], sharded[f"{mode}/1"], sharded[f"{mode}/4"], single[f"{mode}/{BUDGET}"]]
        runs.append(sharded[f"{mode}/{BUDGET}"])
        for other in runs:
            assert abs(float(other["loss"]) - float(base["loss"])) < FORWARD_TOL * max(1.0, abs(float(base["loss"])))
            assert_same_step(base, other)
    # the per-sequence token mean weighs the short rows more: another gradient than the token mean's
    per_sequence, token_mean = single["seq-mean-token-mean/8"], single["token-mean/8"]
    assert max(relative_gradient_diff(token_mean["grads"], per_sequence["grads"]).values()) > 100 * GRAD_RTOL
