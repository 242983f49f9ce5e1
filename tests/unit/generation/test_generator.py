"""The generation seam (``rollout.generator``): the torch decoder chosen once and named, static-KV decoding equal
to the model's own forward on the real-format fixtures, refit and the weight version."""

import copy
import dataclasses

import pytest
import torch

from dtppo.config import ModelConfig
from dtppo.generation import decoder as decoder_module
from dtppo.generation.generator import TorchGenerator
from dtppo.models.causal_lm import build_causal_lm, stop_token_ids
from dtppo.models.tokenizer import build_char_tokenizer, load_tokenizer
from dtppo.types import SampleRequest, SamplingParams

TEXTS = [
    "Natalia sold clips to 48 of her friends in April.",
    "How many apples?",
    "1 + 2 =",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes.",
    "x",
    "The answer is",
]


def _real_format(directory):
    tok = load_tokenizer(str(directory))
    model = build_causal_lm(str(directory), ModelConfig().tiny, len(tok), tok.pad_token_id, tok.eos_token_id, 0)
    prompts = tok(TEXTS, add_special_tokens=False)["input_ids"]
    return model.eval(), tok, prompts


def _both(model, tok, prompts, params: SamplingParams):
    stops = (-1,)  # none: the fixtures' models end almost at once, and every step should be compared
    ids = torch.arange(len(prompts))
    static = TorchGenerator(model, stops, tok.pad_token_id, "static").sample(SampleRequest(prompts, params, 11, ids))
    hf = TorchGenerator(model, stops, tok.pad_token_id, "hf").sample(SampleRequest(prompts, params, 11, ids))
    return static, hf


@pytest.mark.parametrize("fixture", ["qwen_dir", "llama_dir"])
@pytest.mark.parametrize("greedy", [False, True])
def test_static_decoder_matches_the_hf_forward_on_real_formats(fixture, greedy, request):
    """Qwen2.5 (q/k/v biases, tied embedding, GQA) and Llama-2 (no biases, untied head) model directories: the
    same tokens, and log-probs within 1e-5, from the static-KV decoder and from the model's own forward + cache."""
    model, tok, prompts = _real_format(request.getfixturevalue(fixture))
    assert TorchGenerator(model, stop_token_ids(model, tok), tok.pad_token_id).decoder == "static"  # auto
    static, hf = _both(model, tok, prompts, SamplingParams(24, greedy=greedy))
    assert int(static.response_mask.sum()) == len(prompts) * 24
    assert torch.equal(static.input_ids, hf.input_ids) and torch.equal(static.response_mask, hf.response_mask)
    assert float((static.gen_logprobs - hf.gen_logprobs).abs().max()) < 1e-5


def test_a_wrong_static_decoder_is_caught(qwen_dir, monkeypatch):
    """Negative control: a static decoder with the MLP's gate and up projections swapped no longer matches."""
    model, tok, prompts = _real_format(qwen_dir)
    weights = decoder_module.StaticKVDecoder._weights

    def swapped(self, layer):
        w = weights(self, layer)
        return dataclasses.replace(w, gate_up=torch.cat(w.gate_up.chunk(2)[::-1]))

    monkeypatch.setattr(decoder_module.StaticKVDecoder, "_weights", swapped)
    static, hf = _both(model, tok, prompts, SamplingParams(24, greedy=True))
    differs = not torch.equal(static.input_ids, hf.input_ids)
    assert differs or float((static.gen_logprobs - hf.gen_logprobs).abs().max()) > 1e-3


def test_other_architectures_decode_through_the_hf_forward_and_refuse_the_static_decoder(gpt2_dir):
    model, tok, prompts = _real_format(gpt2_dir)
    stops = stop_token_ids(model, tok)
    auto = TorchGenerator(model, stops, tok.pad_token_id)
    assert auto.decoder == "hf" and auto.describe() == (
        "torch backend, hf decoder (gpt2 model): the static decoder implements Qwen2, Qwen3, Llama, Mistral and "
        "Gemma 3 text models, not this gpt2 model"
    )
    rows = auto.sample(SampleRequest(prompts, SamplingParams(8), 3, torch.arange(len(prompts))))
    assert rows.response_mask.sum() > 0
    with pytest.raises(ValueError, match=r"^policy.generation.decoder: static .* not this gpt2 model"):
        TorchGenerator(model, stops, tok.pad_token_id, "static")
    with pytest.raises(ValueError, match=r"policy.generation.decode_graph: .* gpt2 model decodes through the HF"):
        TorchGenerator(model, stops, tok.pad_token_id, compile=True)


def test_refit_copies_the_trained_weights_and_records_their_version():
    """A generator with its own copy (a sharded policy's replica) takes the trained weights at refit; one that
    samples the training model itself copies nothing. Both report the version they were given."""
    tok = build_char_tokenizer()
    trained = build_causal_lm(None, ModelConfig().tiny, len(tok), tok.pad_token_id, tok.eos_token_id, 0)
    replica = copy.deepcopy(trained)
    own_copy = TorchGenerator(replica, (tok.eos_token_id,), tok.pad_token_id)
    itself = TorchGenerator(trained, (tok.eos_token_id,), tok.pad_token_id)
    assert own_copy.version == itself.version == 0
    with torch.no_grad():
        for param in trained.parameters():
            param.add_(0.01)
    assert not torch.equal(replica.lm_head.weight, trained.lm_head.weight)
    own_copy.refit(trained, 3)
    itself.refit(trained, 3)
    assert own_copy.version == itself.version == 3
    assert all(torch.equal(a, b) for a, b in zip(replica.state_dict().values(), trained.state_dict().values()))
    assert itself.model is trained
