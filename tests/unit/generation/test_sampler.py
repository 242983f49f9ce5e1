import torch

from dtppo.config import ModelConfig
from dtppo.generation.generator import TorchGenerator
from dtppo.generation.sampler import choose_tokens, counter_uniform
from dtppo.models.causal_lm import build_causal_lm
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.ops import logprobs_from_logits
from dtppo.types import SampleRequest, SamplingParams

TOK = build_char_tokenizer()


def _model():
    return build_causal_lm(None, ModelConfig().tiny, len(TOK), TOK.pad_token_id, TOK.eos_token_id, seed=0).eval()


def _prompts(n):
    texts = [f"Tom has {i} apples.{' x' * (i % 4)}\nAnswer: " for i in range(n)]
    return TOK(texts, add_special_tokens=False)["input_ids"]


def test_generation_logprobs_match_a_full_forward():
    model = _model()
    exp = TorchGenerator(model, (TOK.eos_token_id,), TOK.pad_token_id).sample(
        SampleRequest(_prompts(8), SamplingParams(20), 7, torch.arange(8))
    )
    with torch.no_grad():
        lp = logprobs_from_logits(
            model(input_ids=exp.input_ids, attention_mask=exp.attention_mask).logits, exp.input_ids
        )
    err = ((lp - exp.gen_logprobs).abs() * exp.response_mask).max()
    assert err < 1e-5
    assert torch.all(exp.gen_logprobs[exp.response_mask == 0] == 0)


def test_generation_logprobs_are_of_the_tempered_distribution():
    """At T = 0.7 π_gen is softmax(logits / 0.7), as the trainer computes it: token_mult_prob_error ≈ 1; the
    untempered log-probs (what a sampler that ignored T would report) are far off."""
    model, mask_error = _model(), lambda a, b, m: float((torch.exp((a - b).abs()) * m).sum() / m.sum())
    exp = TorchGenerator(model, (TOK.eos_token_id,), TOK.pad_token_id).sample(
        SampleRequest(_prompts(8), SamplingParams(20, temperature=0.7), 7, torch.arange(8))
    )
    with torch.no_grad():
        logits = model(input_ids=exp.input_ids, attention_mask=exp.attention_mask).logits
    tempered, plain = (logprobs_from_logits(logits / t, exp.input_ids) for t in (0.7, 1.0))
    assert mask_error(tempered, exp.gen_logprobs, exp.response_mask) <= 1.001
    assert mask_error(plain, exp.gen_logprobs, exp.response_mask) > 1.01


def test_rows_are_right_padded_prompt_then_response():
    model = _model()
    prompts = _prompts(5)
    exp = TorchGenerator(model, (TOK.eos_token_id,), TOK.pad_token_id).sample(
        SampleRequest(prompts, SamplingParams(12), 1, torch.arange(5))
    )
    for b, p in enumerate(prompts):
        assert exp.input_ids[b, : len(p)].tolist() == p
        n = int(exp.response_mask[b].sum())
        assert exp.response_mask[b, len(p) : len(p) + n].all()
        assert exp.attention_mask[b].sum() == len(p) + n
        ends_with_eos = exp.input_ids[b, len(p) + n - 1] == TOK.eos_token_id
        assert bool(ends_with_eos) != bool(exp.truncated[b])
        assert n == 12 or ends_with_eos


def test_samples_depend_only_on_key_and_sample_id():
    model = _model()
    prompts = _prompts(6)
    full = TorchGenerator(model, (TOK.eos_token_id,), TOK.pad_token_id).sample(
        SampleRequest(prompts, SamplingParams(16), 42, torch.arange(6))
    )
    request = SampleRequest(prompts, SamplingParams(16), 42, torch.arange(6), rows=[{"row": i} for i in range(6)])
    part_request = request.take([5, 3, 4])  # a rank's share, in any order
    assert part_request.prompts == [prompts[5], prompts[3], prompts[4]] and len(part_request) == 3
    assert part_request.sample_ids.tolist() == [5, 3, 4] and part_request.rows == [{"row": 5}, {"row": 3}, {"row": 4}]
    assert request.take(slice(3, 6)).sample_ids.tolist() == [3, 4, 5]
    part = TorchGenerator(model, (TOK.eos_token_id,), TOK.pad_token_id).sample(part_request)
    for i, row in enumerate([5, 3, 4]):
        n = int(part.attention_mask[i].sum())
        assert torch.equal(part.input_ids[i, :n], full.input_ids[row, :n])
    other = TorchGenerator(model, (TOK.eos_token_id,), TOK.pad_token_id).sample(
        SampleRequest(prompts, SamplingParams(16), 43, torch.arange(6))
    )
    assert not torch.equal(other.input_ids, full.input_ids)


def test_sampling_matches_the_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).expand(20000, 4)
    tokens, _ = choose_tokens(logits, SamplingParams(1), key=3, sample_ids=torch.arange(20000), t=0)
    freq = torch.bincount(tokens, minlength=4).float() / 20000
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.015)
    u = counter_uniform(3, torch.arange(100), 0, 50)
    assert 0 < u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.02


def test_top_p_and_greedy():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1]])).expand(5000, 3)
    tokens, lp = choose_tokens(logits, SamplingParams(1, top_p=0.8), key=1, sample_ids=torch.arange(5000), t=0)
    assert set(tokens.tolist()) == {0, 1}
    greedy, glp = choose_tokens(logits[:2], SamplingParams(1, greedy=True), 0, torch.arange(2), 0)
    assert greedy.tolist() == [0, 0] and torch.allclose(glp, torch.log(torch.tensor([0.6, 0.6])))


def test_static_decoder_matches_the_hf_forward_path():
    """Same key, same tokens whether the static-KV decoder or the model's own forward + cache decodes."""
    model = _model()
    prompts = _prompts(6)
    fast = TorchGenerator(model, (TOK.eos_token_id,), TOK.pad_token_id, "static")
    slow = TorchGenerator(model, (TOK.eos_token_id,), TOK.pad_token_id, "hf")
    assert TorchGenerator(model, (TOK.eos_token_id,), TOK.pad_token_id).decoder == "static"  # auto, on Qwen2
    fast_rows = fast.sample(SampleRequest(prompts, SamplingParams(20), 5, torch.arange(6)))
    slow_rows = slow.sample(SampleRequest(prompts, SamplingParams(20), 5, torch.arange(6)))
    assert torch.equal(fast_rows.input_ids, slow_rows.input_ids)
    assert torch.equal(fast_rows.response_mask, slow_rows.response_mask)
    assert (fast_rows.gen_logprobs - slow_rows.gen_logprobs).abs().max() < 1e-5


def test_noise_drawn_in_chunks_equals_noise_drawn_per_step():
    from dtppo.generation.sampler import counter_uniform_steps

    ids = torch.tensor([3, 17, 4])
    chunk = counter_uniform_steps(9, ids, 5, 4, 30)
    assert torch.equal(chunk, torch.stack([counter_uniform(9, ids, 5 + s, 30) for s in range(4)]))


def test_a_second_stop_token_from_the_generation_config_ends_rows(tmp_path):
    """A model directory whose generation_config.json lists a second stop token: the stop set holds both, a row
    ends at its first stop token (the same tokens up to there: same key, same noise), and only rows that sampled
    none are truncated."""
    from transformers import GenerationConfig

    from dtppo.models.causal_lm import stop_token_ids

    model = _model()
    prompts, eos, pad = _prompts(8), TOK.eos_token_id, TOK.pad_token_id
    plain = TorchGenerator(model, (eos,), pad).sample(SampleRequest(prompts, SamplingParams(24), 3, torch.arange(8)))
    responses = [row[m.bool()].tolist() for row, m in zip(plain.input_ids, plain.response_mask)]
    second = max(set(sum(responses, [])) - {eos}, key=lambda tok: sum(tok in r[:-1] for r in responses))
    model.generation_config = GenerationConfig(eos_token_id=[eos, second], pad_token_id=pad)
    model.save_pretrained(tmp_path)
    reloaded = build_causal_lm(str(tmp_path), ModelConfig().tiny, len(TOK), pad, eos, seed=0).eval()
    stops = stop_token_ids(reloaded, TOK)
    assert stops == (eos, second)
    both = TorchGenerator(reloaded, stops, pad).sample(SampleRequest(prompts, SamplingParams(24), 3, torch.arange(8)))
    ended_early = 0
    for b, (p, before) in enumerate(zip(prompts, responses)):
        after = both.input_ids[b, len(p) : len(p) + int(both.response_mask[b].sum())].tolist()
        cut = next((i + 1 for i, tok in enumerate(before) if tok in stops), len(before))
        assert after == before[:cut], b
        assert bool(both.truncated[b]) == (after[-1] not in stops)
        ended_early += second in after
    assert ended_early >= 2  # the second token did end rows that the EOS alone let run on


def test_inverse_cdf_against_a_float64_cumulative_sum(monkeypatch):
    """Both levels of the search (blocks, then entries; small blocks so a row spans many, the last one partial):
    the token is the float64 reference's, searchsorted(cumsum(softmax), u), except where u lies within float32
    round-off of a boundary; excluded (-inf) tokens are never drawn, not even at u next to 0 or 1."""
    from dtppo.generation import sampler

    monkeypatch.setattr(sampler, "_CDF_BLOCK", 16)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(400, 203, generator=gen) * 3
    logits[:, ::7] = float("-inf")
    logits[:, 200:] = float("-inf")  # the partial last block holds only excluded tokens
    u = torch.rand(400, generator=gen, dtype=torch.float64)
    u[:4] = torch.tensor([1e-16, 1 - 1e-16, 0.5, 1e-9], dtype=torch.float64)
    tokens = sampler.inverse_cdf(logits, u)
    cdf = torch.softmax(logits.double(), -1).cumsum(-1)
    reference = torch.searchsorted(cdf, u[:, None], right=True).squeeze(-1)
    near_boundary = (cdf - u[:, None]).abs().min(-1).values < 1e-6
    assert torch.equal(tokens[~near_boundary], reference[~near_boundary]) and (~near_boundary).sum() > 390
    assert torch.isfinite(logits.gather(-1, tokens[:, None])).all()
    assert tokens[0] == (logits[0] > float("-inf")).nonzero()[0, 0]  # u → 0: the first allowed token
    assert tokens[1] == (logits[1] > float("-inf")).nonzero()[-1, 0]  # u → 1: the last allowed token


def test_inverse_cdf_hand_case():
    """p = (0.25, 0, 0.25, 0.5): the intervals are [0, .25) -> 0, [.25, .5) -> 2, [.5, 1) -> 3; token 1 never."""
    from dtppo.generation.sampler import inverse_cdf

    logits = torch.log(torch.tensor([[0.25, 0.0, 0.25, 0.5]])).expand(6, 4)
    u = torch.tensor([0.1, 0.2499, 0.25, 0.4999, 0.5, 0.9999], dtype=torch.float64)
    assert inverse_cdf(logits, u).tolist() == [0, 0, 2, 2, 3, 3]


def test_sampling_at_a_large_vocabulary_matches_the_distribution():
    """2,000 draws over 151,936 entries (149 blocks): the mass of three heavy tokens (first block, a middle one,
    the last entry) and of the long tail is reproduced within sampling error (4 standard errors)."""
    vocab, n = 151_936, 2_000
    logits = torch.full((vocab,), -4.0)
    logits[[3, 70_000, vocab - 1]] = torch.tensor([6.0, 5.0, 4.0])
    p = torch.softmax(logits.double(), -1)
    tokens = torch.cat(
        [
            choose_tokens(logits.expand(500, vocab), SamplingParams(1), 11, torch.arange(i, i + 500), 2)[0]
            for i in range(0, n, 500)
        ]
    )
    heavy = [3, 70_000, vocab - 1]
    for tok in heavy:
        freq, q = float((tokens == tok).double().mean()), float(p[tok])
        assert abs(freq - q) < 4 * (q * (1 - q) / n) ** 0.5, (tok, freq, q)
    tail, q = float((~torch.isin(tokens, torch.tensor(heavy))).double().mean()), 1 - float(p[heavy].sum())
    assert abs(tail - q) < 4 * (q * (1 - q) / n) ** 0.5
