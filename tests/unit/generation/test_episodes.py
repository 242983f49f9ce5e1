"""The episode loop (``dtppo.generation.episodes``) on a scripted generator and environment: turns cut at stop strings,
observations appended, each way an episode ends, the token budget, independence of the batch, the episode config
keys and the ablation hook that marks observations as actions. The rows of an episode: tests/unit/test_types.py; GAE
over them: tests/unit/algorithms/test_advantages_turns.py; the losses: tests/unit/workers/test_policy_episodes.py."""

import dataclasses
import math

import pytest
import torch

from dtppo.config import EnvConfig, from_dict
from dtppo.data.chat import ChatFormat
from dtppo.envs.client import EnvClient
from dtppo.generation.episodes import EpisodeGenerator, stop_string_cut
from dtppo.generation.responses import decode_responses
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.ppo.step_metrics import episode_metrics
from dtppo.types import EPISODE_ENDS, SampleRequest, SamplingParams, Segment, build_episode_rows
from tests.support.recipes import REPO

TOK = build_char_tokenizer()
EOS = TOK.eos_token_id
SCRIPTED = f"{REPO / 'tests' / 'support' / 'scripted_env.py'}:Scripted"


# ---- the episode loop on a scripted generator


class ScriptEngine:
    """A ``Generator`` whose sample i answers the k-th turn (k = observations in its prefix + 1) with
    ``script[i][k - 1]``; log-prob of the j-th token -0.01·(j + 1); a text without EOS runs to max_new_tokens."""

    def __init__(self, script):
        self.script, self.version, self.calls = script, 0, []

    def sample(self, request):
        prompts, params, key, sample_ids = request.prompts, request.params, request.key, request.sample_ids
        texts = []
        for prompt, i in zip(prompts, sample_ids.tolist()):
            turn = TOK.decode(prompt).count("<result>")
            texts.append(self.script[i][turn])
        self.calls.append((sample_ids.tolist(), params.max_new_tokens, key))
        episodes, ends = [], []
        for text in texts:
            ids = TOK(text.replace("<EOS>", ""), add_special_tokens=False)["input_ids"]
            ids = (ids + [EOS]) if text.endswith("<EOS>") else ids
            stopped = EOS in ids[: params.max_new_tokens]
            ids = ids[: params.max_new_tokens]
            episodes.append([Segment(ids, 1, [-0.01 * (j + 1) for j in range(len(ids))])])
            ends.append(0 if stopped else 3)
        return build_episode_rows(prompts, episodes, ends, 0)

    def close(self):
        pass


def _loop(script, rows=None, **env):
    cfg = EnvConfig(class_=SCRIPTED, num_workers=0, stop=("</calc>",), **env)
    return EpisodeGenerator(ScriptEngine(script), EnvClient(cfg), TOK, cfg, ChatFormat())


def _prompts(n):
    return [TOK(f"Q{i}\nAnswer: ", add_special_tokens=False)["input_ids"] for i in range(n)]


SCRIPT = [
    ["<calc>2*3</calc> and more text<EOS>", "#### 6<EOS>"],  # a call (cut at </calc>), then the answer
    ["#### 1<EOS>"],  # answers at once
    ["<calc>1+1</calc>", "<calc>2+2</calc>", "<calc>3+3</calc>", "x"],  # calls until max_turns
    ["no stop here at all and it goes on and on"],  # truncated by max_new_tokens
]


def test_the_loop_cuts_at_stop_strings_appends_observations_and_ends_each_way():
    gen = _loop(SCRIPT, max_turns=3)
    rows = [{"prompt": f"Q{i}", "answer": "6"} for i in range(4)]
    e = gen.sample(SampleRequest(_prompts(4), SamplingParams(24), 7, torch.arange(4), rows))
    texts = [TOK.decode(r[a.bool()].tolist()) for r, a in zip(e.input_ids, e.attention_mask)]
    assert texts[0] == "Q0\nAnswer: <calc>2*3</calc><result>6</result>\n#### 6<eos>"
    assert texts[1] == "Q1\nAnswer: #### 1<eos>"
    assert texts[2].endswith("<calc>1+1</calc><result>2</result>\n<calc>2+2</calc><result>4</result>\n<calc>3+3</calc>")
    assert [EPISODE_ENDS[c] for c in e.episode_end.tolist()] == ["env_done", "env_done", "max_turns", "truncated"]
    # Row 0: the observation's tokens are not actions and carry turn 1; the reward of turn 1 (0.5 per call, the
    # scripted environment's) sits on the last token of "</calc>".
    row = e.response_mask[0].bool()
    first_obs = len(_prompts(1)[0]) + len("<calc>2*3</calc>")
    assert not row[first_obs : first_obs + len("<result>6</result>\n")].any()
    assert e.step_rewards[0, first_obs - 1] == 0.5 and e.step_rewards[0].sum() == 0.5 + 1.0
    assert e.gen_logprobs[0, first_obs - 1] == pytest.approx(-0.01 * len("<calc>2*3</calc>"))
    assert decode_responses(TOK, e) == ["#### 6", "#### 1", "<calc>3+3</calc>", SCRIPT[3][0][:24]]
    metrics = episode_metrics(e)
    assert metrics["train/episodes/turns"] == pytest.approx((2 + 1 + 3 + 1) / 4)
    assert metrics["train/episodes/tool_calls"] == pytest.approx((1 + 0 + 2 + 0) / 4)
    assert metrics["train/episodes/ended_by/max_turns"] == 0.25
    # Turn keys: the first turn uses the step's key itself, later turns their own.
    keys = [k for _, _, k in gen.inner.calls]
    assert keys[0] == 7 and len(set(keys)) == len(keys)


def test_the_token_budget_cuts_a_turn_and_drops_an_observation_without_room():
    gen = _loop(SCRIPT, max_turns=3, max_total_tokens=20)
    e = gen.sample(SampleRequest(_prompts(4), SamplingParams(24), 7, torch.arange(4), [{} for _ in range(4)]))
    after_prompt = (e.attention_mask.sum(-1) - torch.tensor([len(p) for p in _prompts(4)])).tolist()
    assert max(after_prompt) <= 20
    # Row 0: 16 tokens of "<calc>2*3</calc>", then an observation of 19 would leave no room: the episode ends.
    assert EPISODE_ENDS[int(e.episode_end[0])] == "max_total_tokens" and after_prompt[0] == 16
    assert EPISODE_ENDS[int(e.episode_end[3])] == "max_total_tokens" and after_prompt[3] == 20
    assert bool(e.truncated[3])


def test_episodes_do_not_depend_on_the_batch_they_are_sampled_in():
    whole = _loop(SCRIPT).sample(SampleRequest(_prompts(4), SamplingParams(24), 7, torch.arange(4), [{}] * 4))
    halves = [
        _loop(SCRIPT).sample(SampleRequest(_prompts(4)[s], SamplingParams(24), 7, torch.arange(4)[s], [{}] * 2))
        for s in (slice(0, 2), slice(2, 4))
    ]
    for name in ("response_mask", "turn_ids", "step_rewards", "gen_logprobs"):
        joined = [getattr(h, name)[r] for h in halves for r in range(2)]
        for r in range(4):
            width = joined[r].shape[0]
            assert torch.equal(getattr(whole, name)[r, :width], joined[r])
            assert getattr(whole, name)[r, width:].abs().sum() == 0


def test_stop_string_cut_is_the_end_of_the_first_stop_string():
    ids = TOK("ab</calc>cd", add_special_tokens=False)["input_ids"]
    assert stop_string_cut(TOK, ids, ("</calc>",)) == 9
    assert stop_string_cut(TOK, ids, ("zz",)) is None and stop_string_cut(TOK, ids, ()) is None


def test_episode_config_keys():
    cfg = from_dict({"env": {"class": SCRIPTED, "kwargs": {"reward_per_call": 0.5, "names": ["a"]}}})
    assert cfg.env.class_ == SCRIPTED and dict(cfg.env.kwargs) == {"names": ("a",), "reward_per_call": 0.5}
    assert cfg.to_dict()["env"]["class"] == SCRIPTED
    assert from_dict(cfg.to_dict()).env == cfg.env
    for bad, match in [
        ({"class": "gsm8k"}, "env.class"),
        ({"class": SCRIPTED, "kwargs": {"x": {"nested": 1}}}, "env.kwargs.x"),
        ({"class": SCRIPTED, "stop": [""]}, "env.stop"),
        ({"class": SCRIPTED, "max_turns": 0}, "env.max_turns"),
    ]:
        with pytest.raises(Exception, match=match):
            from_dict({"env": bad})
    with pytest.raises(Exception, match="generation_ranks"):
        from_dict({"env": {"class": SCRIPTED}, "cluster": {"workers_per_node": 2, "generation_ranks": 1}})
    assert math.isfinite(dataclasses.replace(cfg.env).timeout_s)


def test_the_ablation_hook_marks_observations_as_actions(monkeypatch):
    normal = _loop(SCRIPT).sample(SampleRequest(_prompts(4), SamplingParams(24), 7, torch.arange(4), [{}] * 4))
    monkeypatch.setenv("DTPPO_TEST_OBSERVATIONS_AS_ACTIONS", "1")
    ablated = _loop(SCRIPT).sample(SampleRequest(_prompts(4), SamplingParams(24), 7, torch.arange(4), [{}] * 4))
    observation = normal.attention_mask.bool() & (normal.turn_ids > 0) & ~normal.response_mask.bool()
    assert observation.any() and torch.equal(ablated.input_ids, normal.input_ids)
    assert torch.equal(ablated.response_mask.bool(), normal.response_mask.bool() | observation)
