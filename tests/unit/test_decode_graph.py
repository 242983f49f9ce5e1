"""``policy.generation.decode_graph``: the compiled decode path (torch.compile, mode reduce-overhead; a CUDA graph
on GPUs) gives the eager sampler's tokens and log-probs on the tiny recipe's policy, and its decoder is kept
across rollouts with the same addresses while the weights change in place (an optimizer step, a refit)."""

from pathlib import Path

import torch

from dtppo import config as config_lib
from dtppo.data.loader import PromptLoader, build_sources, encode_prompts
from dtppo.models.causal_lm import build_causal_lm, stop_token_ids
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.rollout.sampler import SamplingParams, generate
TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny-math-cpu.yaml"


def test_compiled_decode_matches_eager_across_rollouts_with_changing_weights():
    cfg = config_lib.load(TINY, ["ppo.init_from_sft=false"])
    tok = build_char_tokenizer()
    model = build_causal_lm(None, cfg.policy.model.tiny, len(tok), tok.pad_token_id, tok.eos_token_id, 0).eval()
    prompts = encode_prompts(tok, PromptLoader(build_sources(cfg)[0], 0).next_batch(8), cfg.data.system_prompt,
                             cfg.data.max_prompt_tokens)
    stops, ids = stop_token_ids(model, tok), torch.arange(8)

    def both(params: SamplingParams, key: int):
        eager = generate(model, prompts, params, stops, tok.pad_token_id, key, ids)
        graph = generate(model, prompts, params, stops, tok.pad_token_id, key, ids, compile=True)
        assert torch.equal(graph.input_ids, eager.input_ids) and torch.equal(graph.response_mask, eager.response_mask)
        assert float(((graph.gen_logprobs - eager.gen_logprobs).abs() * eager.response_mask).max()) < 1e-5
        return graph

    sampled = both(SamplingParams(cfg.policy.generation.max_new_tokens), key=3)
    both(SamplingParams(cfg.policy.generation.max_new_tokens, greedy=True), key=3)
    (decoder,) = model._dtppo_graph_decoders.values()
    addresses = [t.data_ptr() for t in decoder._graph_inputs()]
    with torch.no_grad():  # an optimizer step: every weight changes in place
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    after = both(SamplingParams(cfg.policy.generation.max_new_tokens), key=3)
    assert list(model._dtppo_graph_decoders.values()) == [decoder]
    assert [t.data_ptr() for t in decoder._graph_inputs()] == addresses
    assert not torch.equal(after.input_ids, sampled.input_ids)  # the new weights were used: same key, other tokens
