"""``policy.generation.decode_graph``: the compiled decode path (torch.compile, mode reduce-overhead; a CUDA graph
on GPUs) gives the eager sampler's tokens and log-probs on the tiny recipe's policy (sampled and greedy; checked on
both CPU kernel sets), and its decoder is kept across rollouts with the same addresses while the weights change in
place (an optimizer step, a refit): it then decodes with the new weights."""

import pytest
import torch

from dtppo.data.chat import encode_prompts
from dtppo.data.loader import PromptLoader, build_sources
from dtppo.generation.generator import TorchGenerator
from dtppo.generation.sampler import counter_uniform
from dtppo.models.causal_lm import build_causal_lm, stop_token_ids
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.ops import logprobs_from_logits
from dtppo.types import SampleRequest, SamplingParams
from tests.support.recipes import tiny_config


@pytest.mark.slow  # torch.compile of the decode step; compiled Gemma 3 decoding: test_decoder_families.py
def test_compiled_decode_matches_eager_across_rollouts_with_changing_weights(tmp_path, monkeypatch):
    # Compiled here, for this process's kernel set: inductor's disk cache is not keyed by ATEN_CPU_CAPABILITY, and
    # kernels cached under the AVX-512 kernels gave NaN logits when loaded under the AVX2 ones.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    cfg = tiny_config("ppo.init_from_sft=false")
    tok = build_char_tokenizer()
    model = build_causal_lm(None, cfg.policy.model.tiny, len(tok), tok.pad_token_id, tok.eos_token_id, 0).eval()
    prompts = encode_prompts(
        tok,
        PromptLoader(build_sources(cfg.data, cfg.ppo.seed, cfg.ppo.validation.max_samples)[0], 0).next_batch(8),
        cfg.data,
    )
    stops, ids = stop_token_ids(model, tok), torch.arange(8)

    eager_generator = TorchGenerator(model, stops, tok.pad_token_id)
    graph_generator = TorchGenerator(model, stops, tok.pad_token_id, compile=True)

    def both(params: SamplingParams, key: int):
        eager = eager_generator.sample(SampleRequest(prompts, params, key, ids))
        graph = graph_generator.sample(SampleRequest(prompts, params, key, ids))
        for b in range(len(prompts)):
            _same_or_a_tie(model, eager, graph, b, len(prompts[b]), params, key)
        return graph

    sampled = both(SamplingParams(cfg.policy.generation.max_new_tokens), key=3)
    both(SamplingParams(cfg.policy.generation.max_new_tokens, greedy=True), key=3)
    (decoder,) = graph_generator.graph_decoders.values()
    addresses = [t.data_ptr() for t in decoder._graph_inputs()]
    with torch.no_grad():  # an optimizer step: every weight changes in place
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    params = SamplingParams(cfg.policy.generation.max_new_tokens)
    after = graph_generator.sample(SampleRequest(prompts, params, 3, ids))
    assert list(graph_generator.graph_decoders.values()) == [decoder]
    assert [t.data_ptr() for t in decoder._graph_inputs()] == addresses
    assert not torch.equal(after.input_ids, sampled.input_ids)  # the new weights were used: same key, other tokens
    # The refreshed decoder holds the new weights: a fresh one draws the same tokens, and its log-probs are a full
    # forward's. (Against eager decoding the comparison is above: after many steps of a sharper model, fused and
    # unfused fp32 kernels may round one near-tie apart, which is not what this part checks.)
    with torch.no_grad():
        full = logprobs_from_logits(
            model(input_ids=after.input_ids, attention_mask=after.attention_mask).logits, after.input_ids
        )
    assert float(((full - after.gen_logprobs).abs() * after.response_mask).max()) < 1e-5
    fresh = TorchGenerator(model, stops, tok.pad_token_id, compile=True).sample(SampleRequest(prompts, params, 3, ids))
    assert torch.equal(fresh.input_ids, after.input_ids) and torch.equal(fresh.gen_logprobs, after.gen_logprobs)


def _same_or_a_tie(model, eager, graph, row: int, prompt_len: int, params: SamplingParams, key: int) -> None:
    """Row ``row`` has the same tokens and log-probs (within 1e-5) in both rollouts, up to a first difference, if
    any, that only rounding can decide: the two paths round the same logits apart (fused vs unfused fp32
    kernels, e.g. with 2 threads on the AVX2 kernels), so they may part where the draw falls within 1e-4 of a
    boundary of the CDF (greedy: where the top two logits are within 1e-4). Anything else fails."""
    a, b = eager.input_ids[row], graph.input_ids[row]
    mask = eager.response_mask[row].bool() & graph.response_mask[row].bool()
    differs = (a != b) & mask
    if not differs.any():
        assert torch.equal(eager.response_mask[row], graph.response_mask[row]), row
        assert float((eager.gen_logprobs[row] - graph.gen_logprobs[row]).abs()[mask].max()) < 1e-5, row
        return
    first = int(differs.nonzero()[0, 0])
    before = mask.clone()
    before[first:] = False
    assert float(((eager.gen_logprobs[row] - graph.gen_logprobs[row]).abs() * before).max()) < 1e-5, row
    with torch.no_grad():  # the distribution both drew token `first` from, given their shared prefix
        logits = model(input_ids=a[None, :first]).logits[0, -1].double() / params.temperature
    if params.greedy:
        top = logits.topk(2).values
        assert float(top[0] - top[1]) < 1e-4, (row, first)
    else:
        u = counter_uniform(key, torch.tensor([row]), first - prompt_len, 1)[0, 0]
        assert float((torch.softmax(logits, -1).cumsum(-1) - u).abs().min()) < 1e-4, (row, first)
