"""Multi-turn episodes: the rows and masks of an episode, reward placement, GAE over action tokens only (per token
and per turn) against float64 loops, observation tokens out of every loss (poison there changes nothing), the
critic's V(s_t) after an observation, and the episode loop on a scripted generator and environment."""

import dataclasses
import math

import pytest
import torch

from dtppo.algorithms.advantages import compute_gae, compute_turn_gae, token_level_rewards, turn_starts
from dtppo.config import EnvConfig, from_dict
from dtppo.data.chat import ChatFormat
from dtppo.envs.client import EnvClient
from dtppo.envs.observations import observation_tokens
from dtppo.generation.episodes import EpisodeGenerator, stop_string_cut
from dtppo.generation.responses import decode_responses
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.ppo.advantage_estimator import build_estimator
from dtppo.ppo.step_metrics import episode_metrics
from dtppo.types import (
    EPISODE_ENDS,
    Experience,
    SampleRequest,
    SamplingParams,
    Segment,
    build_episode_rows,
    build_response_mask,
)
from tests.support.recipes import REPO

POISON = 1.0e6
TOK = build_char_tokenizer()
EOS = TOK.eos_token_id
SCRIPTED = f"{REPO / 'tests' / 'support' / 'scripted_env.py'}:Scripted"


def _hand_episode() -> Experience:
    """Row 0: prompt [5, 6], action 1 [7, 8] (reward 0.5), observation [9, 9, 9], action 2 [10, 11, 12] (reward
    -1). Row 1: prompt [5], one action [13, 14]."""
    episodes = [
        [Segment([7, 8], 1, [-0.1, -0.2], 0.5), Segment([9, 9, 9], 1), Segment([10, 11, 12], 2, [-0.3] * 3, -1.0)],
        [Segment([13, 14], 1, [-0.4, -0.5])],
    ]
    return build_episode_rows([[5, 6], [5]], episodes, [0, 3], pad_id=0)


def test_episode_rows_masks_turns_and_rewards_by_hand():
    e = _hand_episode()
    assert e.input_ids.tolist() == [[5, 6, 7, 8, 9, 9, 9, 10, 11, 12], [5, 13, 14, 0, 0, 0, 0, 0, 0, 0]]
    assert e.attention_mask.tolist() == [[1] * 10, [1, 1, 1] + [0] * 7]
    assert e.response_mask.tolist() == [[0, 0, 1, 1, 0, 0, 0, 1, 1, 1], [0, 1, 1] + [0] * 7]
    assert e.turn_ids.tolist() == [[0, 0, 1, 1, 1, 1, 1, 2, 2, 2], [0, 1, 1] + [0] * 7]
    assert e.turn_rewards.tolist() == [[0, 0, 0, 0.5, 0, 0, 0, 0, 0, -1.0], [0.0] * 10]
    assert torch.allclose(e.gen_logprobs[0, 7:], torch.tensor([-0.3] * 3))
    assert e.gen_logprobs[0, 4:7].abs().sum() == 0
    assert e.truncated.tolist() == [False, True]
    assert e.episode_end.tolist() == [0, 3]


def test_one_turn_episode_rows_are_the_single_turn_rows():
    prompts, responses = [[4, 5, 6], [7]], [[8, 9], [10, 11, 12, EOS]]
    e = build_episode_rows(prompts, [[Segment(r, 1, [0.0] * len(r))] for r in responses], [0, 0], pad_id=0)
    expected = build_response_mask(torch.tensor([3, 1]), torch.tensor([2, 4]), 5)
    assert torch.equal(e.response_mask, expected)
    assert e.turn_rewards.abs().sum() == 0


def test_the_final_answer_is_the_last_turn_and_rewards_sum_per_episode():
    tok_ids = lambda s: TOK(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    calc, obs, answer = tok_ids("<calc>2*3</calc>"), tok_ids("<result>6</result>"), tok_ids("#### 6")
    segments = [Segment(calc, 1, [0.0] * len(calc), 0.25), Segment(obs, 1), Segment(answer, 2, [0.0] * len(answer))]
    e = build_episode_rows([tok_ids("Q")], [segments], [0], pad_id=0)
    assert decode_responses(TOK, e) == ["#### 6"]
    e = e.replace(rewards=torch.tensor([1.0]))
    assert e.episode_returns.tolist() == [1.25]


def _gae_loop(rewards, values, mask, gamma, lam):
    """float64 GAE over the valid tokens of each row only (observations skipped), as a list walk."""
    adv = torch.zeros_like(rewards, dtype=torch.float64)
    for b in range(rewards.shape[0]):
        idx = [t for t in range(rewards.shape[1]) if mask[b, t]]
        running, next_v = 0.0, 0.0
        for k in reversed(range(len(idx))):
            t = idx[k]
            last = k == len(idx) - 1
            delta = float(rewards[b, t]) + (0.0 if last else gamma * next_v) - float(values[b, t])
            running = delta + (0.0 if last else gamma * lam * running)
            adv[b, t], next_v = running, float(values[b, t])
    return adv


def test_gae_runs_over_action_tokens_only_and_observation_poison_changes_nothing():
    e = _hand_episode()
    torch.manual_seed(0)
    values = torch.randn(e.input_ids.shape)
    token_rewards = token_level_rewards(torch.tensor([1.0, -0.5]), e.response_mask) + e.turn_rewards
    adv, ret = compute_gae(token_rewards, values, e.response_mask, 0.9, 0.8)
    ref = _gae_loop(token_rewards.double(), values.double(), e.response_mask.bool(), 0.9, 0.8)
    assert torch.allclose(adv.double(), ref, atol=1e-6)
    assert torch.equal(ret, torch.where(e.response_mask.bool(), adv + values, 0.0))
    observation = e.attention_mask.bool() & (e.turn_ids > 0) & ~e.response_mask.bool()
    poisoned = compute_gae(
        torch.where(observation, POISON, token_rewards),
        torch.where(observation, POISON, values),
        e.response_mask,
        0.9,
        0.8,
    )
    assert torch.equal(poisoned[0], adv) and torch.equal(poisoned[1], ret)
    # Negative control: the same poison on an action token does change the advantages.
    action_poisoned = compute_gae(
        token_rewards,
        values.index_put((torch.tensor([0]), torch.tensor([7])), torch.tensor(POISON)),
        e.response_mask,
        0.9,
        0.8,
    )
    assert not torch.equal(action_poisoned[0], adv)


def _turn_gae_loop(e: Experience, token_rewards, values, gamma, lam):
    """float64: one GAE step per turn (value at its first action token, its tokens' rewards summed)."""
    adv = torch.zeros(e.input_ids.shape, dtype=torch.float64)
    ret = torch.zeros_like(adv)
    for b in range(e.batch_size):
        turns = sorted({int(t) for t, m in zip(e.turn_ids[b], e.response_mask[b]) if m})
        tokens = {
            k: [t for t in range(e.input_ids.shape[1]) if e.response_mask[b, t] and e.turn_ids[b, t] == k]
            for k in turns
        }
        v = {k: float(values[b, tokens[k][0]]) for k in turns}
        r = {k: sum(float(token_rewards[b, t]) for t in tokens[k]) for k in turns}
        running = 0.0
        for i in reversed(range(len(turns))):
            k = turns[i]
            last = i == len(turns) - 1
            delta = r[k] + (0.0 if last else gamma * v[turns[i + 1]]) - v[k]
            running = delta + (0.0 if last else gamma * lam * running)
            for t in tokens[k]:
                adv[b, t], ret[b, t] = running, running + v[k]
    return adv, ret


def test_turn_level_gae_against_a_float64_loop():
    e = _hand_episode()
    torch.manual_seed(1)
    values = torch.randn(e.input_ids.shape)
    token_rewards = token_level_rewards(torch.tensor([1.0, -0.5]), e.response_mask) + e.turn_rewards
    token_rewards = token_rewards + 0.01 * e.response_mask  # a reward on every action token: sums per turn
    assert turn_starts(e.response_mask, e.turn_ids).nonzero().tolist() == [[0, 2], [0, 7], [1, 1]]
    adv, ret = compute_turn_gae(token_rewards, values, e.response_mask, e.turn_ids, 0.9, 0.7)
    ref_adv, ref_ret = _turn_gae_loop(e, token_rewards.double(), values.double(), 0.9, 0.7)
    assert torch.allclose(adv.double(), ref_adv, atol=1e-6)
    assert torch.allclose(ret.double(), ref_ret, atol=1e-6)


def _cfg(**ppo):
    return from_dict(
        {
            "ppo": {"num_prompts_per_step": 2, **ppo},
            "policy": {"train_global_batch_size": 2},
            "value": {"train_global_batch_size": 2},
            "env": {"class": SCRIPTED},
        }
    )


def test_the_estimator_adds_turn_rewards_and_grpo_uses_episode_returns():
    e = _hand_episode().replace(rewards=torch.tensor([1.0, -0.5]))
    torch.manual_seed(2)
    e = e.replace(old_values=torch.randn(e.input_ids.shape))
    est = build_estimator(_cfg(normalize_advantages=False))
    out = est(e)
    expected = compute_gae(
        token_level_rewards(e.rewards, e.response_mask) + e.turn_rewards, e.old_values, e.response_mask, 1.0, 1.0
    )
    assert torch.equal(out.advantages, expected[0])
    # Without the turn rewards the advantages differ (the negative control).
    assert not torch.equal(est(e.replace(turn_rewards=torch.zeros_like(e.turn_rewards))).advantages, out.advantages)
    grpo = build_estimator(_cfg(advantage_estimator="grpo", num_generations_per_prompt=2))(e)
    returns = e.episode_returns  # 0.5 + 1.0 - 1.0 = 0.5 and -0.5
    assert returns.tolist() == [0.5, -0.5]
    assert grpo.advantages[0, 2] > 0 > grpo.advantages[1, 1]


def test_turn_unit_estimator_and_its_config_rules():
    e = _hand_episode().replace(rewards=torch.tensor([1.0, -0.5]), old_values=torch.zeros(2, 10))
    out = build_estimator(_cfg(gae_unit="turn", normalize_advantages=False))(e)
    # Row 0: turn 2's advantage is its reward sum (1 - 1 = 0), turn 1's 0.5 + 0 (γ = λ = 1, V = 0).
    assert out.advantages[0].tolist() == [0, 0, 0.5, 0.5, 0, 0, 0, 0, 0, 0]
    with pytest.raises(Exception, match="ppo.gae_unit"):
        from_dict({"ppo": {"gae_unit": "turn"}})


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
    assert e.turn_rewards[0, first_obs - 1] == 0.5 and e.turn_rewards[0].sum() == 0.5 + 1.0
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
    for name in ("response_mask", "turn_ids", "turn_rewards", "gen_logprobs"):
        joined = [getattr(h, name)[r] for h in halves for r in range(2)]
        for r in range(4):
            width = joined[r].shape[0]
            assert torch.equal(getattr(whole, name)[r, :width], joined[r])
            assert getattr(whole, name)[r, width:].abs().sum() == 0


def test_stop_string_cut_and_observation_tokens():
    ids = TOK("ab</calc>cd", add_special_tokens=False)["input_ids"]
    assert stop_string_cut(TOK, ids, ("</calc>",)) == 9
    assert stop_string_cut(TOK, ids, ("zz",)) is None and stop_string_cut(TOK, ids, ()) is None
    assert TOK.decode(observation_tokens(TOK, ChatFormat(), "<result>1</result>", [EOS])) == "<result>1</result>"
    # The character tokenizer's template prints a message's content, then the answer header after the last one.
    tool = [{"role": "tool", "content": "7"}]
    assert TOK.decode(observation_tokens(TOK, ChatFormat(), tool, [EOS])) == "7\nAnswer: "


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
