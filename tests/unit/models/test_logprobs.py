"""Chunked log-probs over the response tokens only (models/logprobs.py) equal the full-logits computation: values
against a float64 reference, gradients against today's fp32 path, packed rows, any chunk size, other models."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from dtppo.config import ModelConfig
from dtppo.models.causal_lm import build_causal_lm
from dtppo.models.logprobs import sequence_logprobs, token_logprobs
from dtppo.models.packing import pack_rows
from dtppo.ops import logprobs_from_logits
from dtppo.types import build_response_mask

VOCAB = 60


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.tensor([3, 7, 5, 2, 9])
    response = torch.tensor([6, 1, 9, 4, 3])
    width = int((prompt + response).max())
    attention = (torch.arange(width)[None] < (prompt + response)[:, None]).long()
    ids = torch.randint(3, VOCAB, (5, width), generator=g) * attention
    return ids, attention, build_response_mask(prompt, response, width).bool()


def _qwen():
    return build_causal_lm(None, ModelConfig().tiny, VOCAB, 0, 1, seed=3)


def _gpt2():
    torch.manual_seed(4)
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


@pytest.mark.parametrize("build", [_qwen, _gpt2], ids=["qwen2", "gpt2"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 4, 10_000])
def test_equals_a_float64_full_logits_reference(build, temperature, chunk):
    model = build().eval()
    ids, attention, response = _batch()
    with torch.no_grad():
        got = token_logprobs(model, ids, attention, response, temperature, chunk)
        logits = model.double()(input_ids=ids, attention_mask=attention).logits
    reference = logprobs_from_logits(logits / temperature, ids).double()
    assert torch.allclose(got.double()[response], reference[response], atol=2e-5, rtol=0)
    assert torch.all(got[~response] == 0)  # prompt and pad positions are never computed
    assert got.dtype == torch.float32


def test_gradients_equal_todays_full_logits_path():
    ids, attention, response = _batch(seed=1)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2)) * response

    def grads(compute):
        model = _qwen()
        (compute(model) * weights).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    chunked = grads(lambda m: token_logprobs(m, ids, attention, response, 0.7, chunk_size=3))
    full = grads(lambda m: logprobs_from_logits(m(input_ids=ids, attention_mask=attention).logits / 0.7, ids))
    for name, grad in full.items():
        assert torch.allclose(chunked[name], grad, atol=1e-6, rtol=1e-4), name
    assert chunked["model.embed_tokens.weight"].abs().sum() > 0  # the tied head trained through the chunks


def test_packed_rows_equal_padded_rows():
    model = _qwen().eval()
    ids, attention, response = _batch(seed=5)
    with torch.no_grad():
        padded = sequence_logprobs(model, ids, attention, response, 1.0, 4, packing=False)
        unpacked = sequence_logprobs(model, ids, attention, response, 1.0, 4, packing=True)
    assert pack_rows(ids, attention).num_rows < ids.shape[0]
    assert torch.equal(padded, token_logprobs(model, ids, attention, response, 1.0, 4))
    assert torch.allclose(unpacked, padded, atol=1e-5, rtol=0)


def test_a_response_at_a_packed_sequence_start_gets_no_prediction_from_its_neighbour():
    model = _qwen().eval()
    ids, attention, _ = _batch(seed=6)
    everything = attention.bool()  # every token wanted, even each sequence's first
    with torch.no_grad():
        out = sequence_logprobs(model, ids, attention, everything, 1.0, 8, packing=True)
    assert torch.all(out[:, 0] == 0) and torch.all(out[:, 1:][everything[:, 1:]] != 0)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_chunked_head_gradients_equal_autograd_in_float64(temperature):
    from dtppo.models.logprobs import chunked_logprobs

    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(13, 5, dtype=torch.float64, generator=g, requires_grad=True)
    bias = torch.randn(13, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 13, (11,), generator=g)
    upstream = torch.randn(11, dtype=torch.float64, generator=g)
    reference = torch.log_softmax((hidden @ weight.T + bias) / temperature, -1).gather(-1, targets[:, None]).squeeze(-1)
    expected = torch.autograd.grad((reference * upstream).sum(), (hidden, weight, bias))
    got = chunked_logprobs(hidden, weight, bias, targets, temperature, chunk_size=4)
    assert torch.allclose(got.double(), reference, atol=1e-6)
    for ours, theirs in zip(torch.autograd.grad((got.double() * upstream).sum(), (hidden, weight, bias)), expected):
        assert torch.allclose(ours, theirs, atol=1e-6), (ours - theirs).abs().max()
