"""The text of generated responses (``dtppo.generation.responses``): the response tokens only, special tokens dropped,
an episode's final answer (its last assistant turn); validation's answers sampled in batches with the validation
stream's key and each problem's own sample id, so a share of the set draws what the whole set would."""

import torch

from dtppo.config import from_dict
from dtppo.data.problem import Problem
from dtppo.generation.responses import decode_responses, sample_responses
from dtppo.generation.sampler import stream_key
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.types import SampleRequest, Segment, build_episode_rows

TOK = build_char_tokenizer()
EOS = TOK.eos_token_id


def _ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


def test_a_response_is_its_generated_tokens_without_the_prompt_pad_or_eos():
    prompts, responses = [_ids("Q1\nAnswer: "), _ids("Q22\nAnswer: ")], [_ids("#### 4") + [EOS], _ids("12")]
    rows = build_episode_rows(prompts, [[Segment(r, 1, [0.0] * len(r))] for r in responses], [0, 3], TOK.pad_token_id)
    assert decode_responses(TOK, rows) == ["#### 4", "12"]


def test_an_episodes_response_is_its_last_assistant_turn():
    calc, obs, answer = _ids("<calc>2*3</calc>"), _ids("<result>6</result>"), _ids("#### 6")
    segments = [Segment(calc, 1, [0.0] * len(calc), 0.25), Segment(obs, 1), Segment(answer, 2, [0.0] * len(answer))]
    e = build_episode_rows([_ids("Q")], [segments], [0], pad_id=0)
    assert decode_responses(TOK, e) == ["#### 6"]


class Echo:
    """A sampler that answers each prompt with its sample id as text and records the requests."""

    def __init__(self):
        self.requests: list[SampleRequest] = []

    def sample(self, request):
        self.requests.append(request)
        answers = [_ids(str(i)) + [EOS] for i in request.sample_ids.tolist()]
        episodes = [[Segment(a, 1, [0.0] * len(a))] for a in answers]
        return build_episode_rows(request.prompts, episodes, [0] * len(request), TOK.pad_token_id)


def _cfg():
    return from_dict(
        {"ppo": {"validation": {"batch_size": 2, "greedy": True}}, "policy": {"generation": {"max_new_tokens": 9}}}
    )


def test_validation_samples_in_batches_with_its_own_stream_and_each_problems_id():
    cfg, echo = _cfg(), Echo()
    problems = [Problem(f"Q{i}", "", str(i), {"level": i}) for i in range(5)]
    args = (cfg.policy.generation, cfg.ppo.validation, cfg.data, cfg.ppo.seed, 7)
    out = sample_responses(echo, TOK, problems, *args)
    assert out.texts == ["0", "1", "2", "3", "4"] and out.lengths == [2.0] * 5  # the id and EOS
    assert [r.sample_ids.tolist() for r in echo.requests] == [[0, 1], [2, 3], [4]]
    request = echo.requests[0]
    assert request.key == stream_key(cfg.ppo.seed, 7, stream=1) != stream_key(cfg.ppo.seed, 7)
    assert request.params.greedy and request.params.max_new_tokens == 9
    assert request.rows[1] == {"prompt": "Q1", "level": 1, "answer": "1"}
    assert TOK.decode(request.prompts[0]) == "Q0\nAnswer: "
    # a share of the set starting at problem 3 draws with the ids the whole set gave it
    share = Echo()
    assert sample_responses(share, TOK, problems[3:], *args, first_index=3).texts == ["3", "4"]
    assert torch.equal(share.requests[0].sample_ids, torch.tensor([3, 4]))
