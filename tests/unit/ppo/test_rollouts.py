"""Where each step's rollouts come from (``dtppo.ppo.rollouts``), in one process: the prompt queue that draws each
step's batch once and in step order, ahead or not, and resumes where a checkpoint says; a step's request (its stream
key, sample ids past dynamic sampling's earlier batches); the policy's own ranks sampling right before the step and
refitted after it; a batch in flight stored as plain data and checked against the prompts drawn again. With
generation ranks: tests/functional/test_async.py."""

from contextlib import contextmanager

import pytest
import torch

from dtppo.data.loader import PromptLoader, build_sources
from dtppo.errors import CheckpointError
from dtppo.generation.remote import RemoteBatch
from dtppo.generation.sampler import stream_key
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.ppo.rollouts import (
    LocalRollouts,
    PromptQueue,
    _batch_from_state,
    _batch_state,
    _check_prompts,
    build_rollouts,
    rollout_request,
)
from dtppo.types import SampleRequest, Segment, build_episode_rows
from tests.support.recipes import tiny_config

TOK = build_char_tokenizer()
BATCHES = [f"{role}.train_global_batch_size=8" for role in ("policy", "value")]


def _cfg(*overrides):
    return tiny_config("ppo.num_prompts_per_step=4", "ppo.num_generations_per_prompt=2", *BATCHES, *overrides)


def _queue(cfg) -> PromptQueue:
    source = build_sources(cfg.data, cfg.ppo.seed, cfg.ppo.validation.max_samples, tokenizer=TOK)[0]
    return PromptQueue(cfg, TOK, PromptLoader(source, cfg.ppo.seed))


def test_batches_drawn_ahead_are_the_batches_drawn_in_step(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)
    cfg = _cfg()
    in_step, ahead = _queue(cfg), _queue(cfg)
    one_by_one = [in_step.pop(step) for step in range(4)]
    ahead.draw_through(3)
    assert [ahead.pop(step) for step in range(2)] == one_by_one[:2]
    state = ahead.state_dict()  # what a checkpoint after step 1 records: where step 2's draw began
    assert state == {"loader": ahead.position(2), "step": 2}
    assert [ahead.pop(step) for step in (2, 3)] == one_by_one[2:]
    assert [p.question for p in one_by_one[0][0][:2]] == [one_by_one[0][0][0].question] * 2  # each prompt twice
    resumed = _queue(cfg)
    resumed.load_state_dict(state)
    assert [resumed.pop(step) for step in (2, 3)] == one_by_one[2:]


def test_a_batch_repeats_each_prompt_once_per_generation_and_a_resume_draws_the_same(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)
    cfg = _cfg()
    queue = _queue(cfg)
    problems, prompts = queue.pop(0)
    assert len(problems) == 8 and problems[0] == problems[1] and prompts[0] == prompts[1] != prompts[2]
    state = queue.state_dict()
    following = queue.pop(1)
    resumed = _queue(cfg)
    resumed.load_state_dict(state)
    assert resumed.pop(1) == following
    extra = queue.draw_extra()  # dynamic sampling's extra batch: recorded nowhere
    assert extra != following and queue.state_dict()["step"] == 2


def test_a_steps_request_has_its_stream_key_and_sample_ids_past_the_earlier_batches(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)
    cfg = _cfg("policy.generation.min_new_tokens=2")
    request = rollout_request(cfg, 3, [[5], [6], [7]], extra=2)
    assert request.key == stream_key(cfg.ppo.seed, 3) != stream_key(cfg.ppo.seed, 4)
    assert request.sample_ids.tolist() == [6, 7, 8] and request.rows is None
    gen = cfg.policy.generation
    assert (request.params.max_new_tokens, request.params.min_new_tokens) == (gen.max_new_tokens, 2)
    assert not request.params.greedy


class _Policy:
    """A policy role that records what the rollouts ask of it and answers each prompt with one token."""

    def __init__(self):
        self.calls, self.generating = [], False

    def refit(self, version):
        self.calls.append(("refit", version))

    @contextmanager
    def generation(self):
        self.generating = True
        yield
        self.generating = False

    def generate(self, request: SampleRequest):
        assert self.generating
        self.calls.append(("generate", request.key, request.sample_ids.tolist()))
        episodes = [[Segment([9], 1, [-0.5])] for _ in request.prompts]
        return build_episode_rows(request.prompts, episodes, [0] * len(request), 0)

    def close(self):
        self.calls.append(("close",))


def test_the_policys_own_ranks_sample_each_step_and_are_refitted_after_an_update(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)
    cfg, policy = _cfg(), _Policy()
    rollouts = build_rollouts(cfg, policy, TOK, _queue(cfg).loader)
    assert isinstance(rollouts, LocalRollouts)
    rollouts.start(0)
    first = rollouts.take(0)
    rollouts.publish(1, updated=True)
    rollouts.publish(2, updated=False)  # a step that did not update the policy: nothing to send
    extra = rollouts.take_extra(1, extra=1)
    rollouts.close()
    key0, key1 = stream_key(cfg.ppo.seed, 0), stream_key(cfg.ppo.seed, 1)
    assert policy.calls == [
        ("refit", 0),
        ("generate", key0, list(range(8))),
        ("refit", 1),
        ("generate", key1, list(range(8, 16))),
        ("close",),
    ]
    assert first.staleness == 0 and first.metrics == {} and len(first.problems) == 8
    assert first.experience.response_mask.sum() == 8 and extra.problems != first.problems


def _batch(prompts) -> RemoteBatch:
    episodes = [[Segment([9, 9], 1, [-0.5, -0.25])] for _ in prompts]
    return RemoteBatch(build_episode_rows(prompts, episodes, [0, 3], 0), 2, 1.5, 0.25, 0.125, 2.0)


def test_a_batch_in_flight_is_stored_as_plain_data_and_read_back_whole():
    batch = _batch([[4, 5], [6]])
    state = _batch_state(batch)
    assert all(isinstance(v, (torch.Tensor, int, dict)) for v in state.values())
    back = _batch_from_state(state)
    assert (back.version, back.busy, back.waited, back.loading, back.cycle) == (2, 1.5, 0.25, 0.125, 2.0)
    for name in ("input_ids", "attention_mask", "response_mask", "gen_logprobs", "truncated", "turn_ids"):
        assert torch.equal(getattr(back.experience, name), getattr(batch.experience, name))


def test_a_stored_batch_must_begin_with_the_prompts_drawn_again():
    batch = _batch([[4, 5], [6]])
    _check_prompts(3, batch.experience, [[4, 5], [6]])
    with pytest.raises(CheckpointError, match="batch in flight for step 3 does not hold the prompts"):
        _check_prompts(3, batch.experience, [[4, 5], [7]])
