"""bf16 models: the decoder's decode-step scores and both heads (the decoder's and the trainer's chunked one) are
computed in fp32, so what a bf16 model's tensors hold is all that is rounded: checked against float64 references
of the same bf16 inputs, at the sizes of a trained model's scores (10-30) and logits (10-20), where bf16 rounds by
0.06-0.125. Each check also computes the rounded variant the code had, which must miss the bound (the tests can
tell the two apart). Measured on a whole model: bench/results/perf/bf16_logprobs.json, docs/guides/performance.md."""

import torch
import torch.nn.functional as F

from dtppo.generation.decoder import _attend_decode, _forward
from dtppo.generation.decoder_weights import _Dims
from dtppo.models.logprobs import chunked_logprobs

GEN = torch.Generator().manual_seed(0)


def _logits_like_a_trained_model(rows: int, hidden: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 hidden [rows, H] and head [V, H] whose logits spread by about 2 around a per-row offset of 10-20."""
    h = torch.randn(rows, hidden, generator=GEN)
    h[:, 0] = 1.0 + torch.rand(rows, generator=GEN)  # the feature every vocabulary row reads: the offset
    w = torch.randn(vocab, hidden, generator=GEN) * 2.0 / hidden**0.5
    w[:, 0] = 10.0
    return h.bfloat16(), w.bfloat16()


def test_the_trainers_chunked_head_upcasts_before_the_log_softmax():
    hidden, weight = _logits_like_a_trained_model(24, 64, 300)
    targets = torch.randint(0, 300, (24,), generator=GEN)
    reference = torch.log_softmax(hidden.double() @ weight.double().T, -1).gather(-1, targets[:, None]).squeeze(-1)
    got = chunked_logprobs(hidden, weight, None, targets, 1.0, chunk_size=7)
    rounded = torch.log_softmax(F.linear(hidden, weight).float(), -1).gather(-1, targets[:, None]).squeeze(-1)
    assert float((got.double() - reference).abs().max()) < 1e-4
    assert float((rounded.double() - reference).abs().max()) > 1e-2  # bf16 logits: what the head did before


def test_the_decoders_head_upcasts_before_the_log_softmax():
    hidden, weight = _logits_like_a_trained_model(8, 64, 300)
    dims = _Dims(4, 2, 16, 1e-6, 0.25, False, "silu", None, (0,), (0,), (None,))
    # No layers: the final norm and the head of ``_forward`` on one embedded token per row.
    logits = _forward(
        torch.arange(8)[:, None], hidden, None, [], [], torch.ones(64).bfloat16(), weight, None, None, 1, [], dims
    )
    normed = hidden.float() * torch.rsqrt(hidden.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    reference = normed.bfloat16().double() @ weight.double().T
    assert logits.dtype == torch.float32
    assert float((logits.double() - reference).abs().max()) < 1e-4
    rounded = F.linear(normed.bfloat16(), weight).float()
    assert float((rounded.double() - reference).abs().max()) > 1e-2


def test_decode_step_scores_are_fp32_for_a_bf16_cache():
    batch, n_q, n_kv, head_dim, keys = 3, 4, 2, 16, 40
    dims = _Dims(n_q, n_kv, head_dim, 1e-6, head_dim**-0.5, False, "silu", None, (0,), (0,), (None,))
    q = (torch.randn(batch, n_q, head_dim, generator=GEN) * 3).bfloat16()  # scores of about 10-30
    k_cache = (torch.randn(batch, n_kv, keys, head_dim, generator=GEN) * 3).bfloat16()
    v_cache = torch.randn(batch, n_kv, keys, head_dim, generator=GEN).bfloat16()
    bias = torch.zeros(batch * n_kv, n_q // n_kv, keys).bfloat16()
    got = _attend_decode(q, k_cache, v_cache, bias, keys, dims).double()
    qg = q.double().reshape(batch * n_kv, n_q // n_kv, head_dim)
    k, v = k_cache.double().reshape(batch * n_kv, keys, head_dim), v_cache.double().reshape(batch * n_kv, keys, -1)
    scores = qg @ k.transpose(1, 2) * dims.scale
    reference = (scores.softmax(-1) @ v).reshape(batch, -1)
    rounded_scores = torch.baddbmm(
        bias,
        q.reshape(batch * n_kv, -1, head_dim),
        k_cache.reshape(batch * n_kv, keys, -1).transpose(1, 2),
        alpha=dims.scale,
    )
    # The code before: the same but for bf16 scores (then the same bf16 probabilities and output). What is left
    # after the fix is the probabilities' and the output's own rounding (mean 1.2e-3 here, 3.2e-3 before).
    probs = rounded_scores.softmax(-1, dtype=torch.float32).bfloat16()
    rounded = torch.bmm(probs, v_cache.reshape(batch * n_kv, keys, -1)).reshape(batch, -1).double()
    error, rounded_error = (got - reference).abs().mean(), (rounded - reference).abs().mean()
    assert float(error) < 2e-3 and float(rounded_error) > 2 * float(error)
