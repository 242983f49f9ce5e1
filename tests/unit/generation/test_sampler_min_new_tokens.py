"""``min_new_tokens`` (vLLM's ``min_tokens``): no stop token before a response has that many tokens.

A fake decoder whose stop tokens lead every other token by 9 nats makes a free sampler stop at once, so each
response's length says where the first stop was allowed; its logits are known, so the recorded log-probs are
checked against a float64 reference of the distribution actually sampled from (stop tokens removed before the
minimum, the full one after).
"""

import pytest
import torch

from dtppo.config import EnvConfig, ModelConfig
from dtppo.data.chat import ChatFormat
from dtppo.envs.client import EnvClient
from dtppo.generation.episodes import EpisodeGenerator
from dtppo.generation.generator import TorchGenerator
from dtppo.generation.remote import GenerationClient, GenerationService
from dtppo.generation.sampler import left_padded, sample_tokens
from dtppo.models.causal_lm import build_causal_lm
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.types import SampleRequest, SamplingParams
from tests.support.recipes import tiny_config
from tests.unit.generation.test_episodes import SCRIPT, SCRIPTED, TOK, ScriptEngine, _prompts

VOCAB, STOPS, PAD, MAX_NEW = 40, (3, 7), 0, 12
PROMPTS = [[5, 6, 8], [9, 10], [11, 12, 13, 14], [15], [16, 17], [18, 19, 20]]


class StopHappyDecoder:
    """Next-token logits [B, VOCAB] drawn once per rollout (seeded), with the stop tokens 9 nats ahead."""

    def __init__(self, batch: int):
        gen = torch.Generator().manual_seed(0)
        self.logits = torch.randn(MAX_NEW, batch, VOCAB, generator=gen)
        self.logits[..., list(STOPS)] += 9.0

    def start(self, ids, attention_mask, positions, prompt_lengths, max_new) -> torch.Tensor:
        return self.logits[0]

    def step(self, tokens: torch.Tensor, t: int) -> torch.Tensor:
        return self.logits[t + 1]


def _sample(params: SamplingParams):
    ids, attn, lengths = left_padded(PROMPTS, PAD, torch.device("cpu"))
    decoder = StopHappyDecoder(len(PROMPTS))
    batch = sample_tokens(decoder, ids, attn, lengths, params, STOPS, PAD, 11, torch.arange(len(PROMPTS)))
    return batch, decoder.logits


def _responses(batch):
    """Each row's response tokens and log-probs (lists of [N_b] tensors)."""
    masks = batch.response_mask.bool()
    return [batch.input_ids[b][m] for b, m in enumerate(masks)], [batch.gen_logprobs[b][m] for b, m in enumerate(masks)]


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("least", [0, 1, 5, MAX_NEW - 1])
def test_no_stop_token_before_min_new_tokens(least, greedy):
    """Every row's first stop is at position ``least`` exactly (the stop tokens hold ~all the mass); with
    ``least = 0`` (the negative control: the same decoder without the minimum) every response is the stop alone."""
    batch, logits = _sample(SamplingParams(MAX_NEW, greedy=greedy, min_new_tokens=least))
    tokens, logprobs = _responses(batch)
    stops = torch.tensor(STOPS)
    for b, (row, lp) in enumerate(zip(tokens, logprobs)):
        assert len(row) == least + 1
        assert not torch.isin(row[:least], stops).any() and int(row[least]) in STOPS
        full = logits[: len(row), b].double()
        masked = full.clone()
        masked[:least, list(STOPS)] = float("-inf")
        reference = masked.log_softmax(-1).gather(-1, row[:, None]).squeeze(-1)
        assert torch.allclose(lp.double(), reference, atol=1e-5)
        if least:  # the recorded log-probs are not the full distribution's before the minimum
            unmasked = full.log_softmax(-1).gather(-1, row[:, None]).squeeze(-1)
            assert (lp[:least].double() - unmasked[:least]).min() > 3.0
    assert not batch.truncated.any()


def test_min_equal_to_max_makes_every_response_exactly_that_long():
    batch, _ = _sample(SamplingParams(MAX_NEW, min_new_tokens=MAX_NEW))
    assert batch.response_mask.sum(-1).tolist() == [MAX_NEW] * len(PROMPTS)
    assert batch.truncated.all()
    assert not torch.isin(batch.input_ids[batch.response_mask.bool()], torch.tensor(STOPS)).any()


def test_a_real_model_generates_exactly_max_new_tokens():
    """Through the TorchGenerator (the static decoder on the tiny model): min = max gives T tokens per row, and
    the same request without the minimum stops some rows early at the EOS-biased head."""
    tok = build_char_tokenizer()
    model = build_causal_lm(None, ModelConfig().tiny, len(tok), tok.pad_token_id, tok.eos_token_id, seed=0).eval()
    with torch.no_grad():  # as tests/support/hf_fixtures.qwen_format_dir: the tied head's EOS logit leads
        embed = model.model.embed_tokens.weight
        embed[:, 0] = 0.5
        embed[tok.eos_token_id, 0] = 1.2
    prompts = tok([f"{i} + {i} = " for i in range(6)], add_special_tokens=False)["input_ids"]
    generator = TorchGenerator(model, (tok.eos_token_id,), tok.pad_token_id)
    fixed = generator.sample(SampleRequest(prompts, SamplingParams(16, min_new_tokens=16), 3, torch.arange(6)))
    free = generator.sample(SampleRequest(prompts, SamplingParams(16), 3, torch.arange(6)))
    assert fixed.response_mask.sum(-1).tolist() == [16] * 6
    assert not (fixed.input_ids[fixed.response_mask.bool()] == tok.eos_token_id).any()
    assert free.response_mask.sum(-1).max() < 16


class _Wire:
    """Both ends of a bridge in one process: what the client posts, the service takes, in order."""

    def __init__(self):
        self.messages: list[torch.Tensor] = []
        self.hello = [torch.tensor([2]), torch.tensor(list(b"ok"), dtype=torch.uint8)]  # the service's greeting

    def recv(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        return self.hello.pop(0)

    def post(self, tensor: torch.Tensor, what: str) -> None:
        self.messages.append(tensor.clone())

    def take(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        return self.messages.pop(0)


class _Recorder:
    """A generator that keeps the request it was asked for."""

    version = 4

    def prepare(self) -> None: ...

    def finish(self) -> None: ...

    def sample(self, request: SampleRequest):
        self.request = request
        return request


@pytest.mark.parametrize("least", [0, 7])
def test_min_new_tokens_travels_to_the_generation_ranks(least):
    """The request header carries it (validation's 0 as well as a rollout's k), not the ranks' own config."""
    wire, recorder = _Wire(), _Recorder()
    client = GenerationClient(wire)
    client.submit(3, SampleRequest(PROMPTS, SamplingParams(MAX_NEW, min_new_tokens=least), 5, torch.arange(6)), 4)
    service = object.__new__(GenerationService)
    service.policy, service.index, service.count = tiny_config().policy, 0, 1
    service.bridge, service.generator, service._times = wire, recorder, {"busy": 0.0}
    service._reply = lambda tag, version, experience: None
    service._answer(wire.take(torch.zeros(0), "header").tolist())
    assert recorder.request.params == SamplingParams(MAX_NEW, min_new_tokens=least)
    assert recorder.request.prompts == PROMPTS and recorder.request.key == 5


def test_episodes_apply_it_to_each_turn_within_the_turn_budget():
    """Every assistant turn is asked for min(min_new_tokens, the turn's token cap): the first turn the full 20, the
    second, with 5 tokens left in the transcript, 5 (a minimum above the turn's cap would ask the impossible)."""
    engine = _RecordingScript(SCRIPT)
    cfg = EnvConfig(class_=SCRIPTED, num_workers=0, stop=("</calc>",), max_turns=3, max_total_tokens=40)
    gen = EpisodeGenerator(engine, EnvClient(cfg), TOK, cfg, ChatFormat())
    gen.sample(SampleRequest(_prompts(4), SamplingParams(24, min_new_tokens=20), 7, torch.arange(4), [{}] * 4))
    asked = [(p.max_new_tokens, p.min_new_tokens) for p in engine.params]
    assert asked[0] == (24, 20)
    assert all(least == min(20, most) for most, least in asked)
    assert asked[1:] == [(5, 5)]


class _RecordingScript(ScriptEngine):
    def __init__(self, script):
        super().__init__(script)
        self.params: list[SamplingParams] = []

    def sample(self, request):
        self.params.append(request.params)
        return super().sample(request)
