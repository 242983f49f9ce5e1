"""Multi-turn episodes on any generator (docs/guides/episodes.md): ``EpisodeGenerator`` runs the turn loop behind the
``Generator`` seam, so workers, the trainer and validation see one more generator.

Per turn, every unfinished episode samples one assistant turn from its whole prefix (prompt, earlier turns and
observations) with the inner generator's ``sample``, under the turn's own stream key (``sampler.turn_key``): an
episode's tokens depend on its sample index, the step and the weights only, whatever the batch it is sampled in or
the number of ranks. A turn ends at a stop token or at the first of ``env.stop``'s strings (the generator samples on
past it; those tokens are dropped here, which changes none before them); the environment answers it, and its observation
(cut to ``env.max_observation_tokens``) is appended for the next turn: text as it is, chat messages as the text the
policy's chat template renders for them after the turn (``data.chat.ChatFormat.turn_text``). An episode ends when
the environment says done, after ``env.max_turns`` turns, when ``env.max_total_tokens`` leaves no room, or when a turn
ends without a stop (truncated; the environment does not see a cut-off turn).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn
from transformers import PreTrainedTokenizerBase

from dtppo.config import EnvConfig
from dtppo.data.chat import ChatFormat
from dtppo.envs.client import EnvClient
from dtppo.envs.interface import Observation
from dtppo.envs.observations import observation_tokens
from dtppo.faults import observations_as_actions
from dtppo.generation.generator import Generator
from dtppo.generation.sampler import turn_key
from dtppo.types import EPISODE_ENDS, Experience, SampleRequest, Segment, build_episode_rows


def stop_string_cut(tokenizer: PreTrainedTokenizerBase, tokens: list[int], stops: tuple[str, ...]) -> int | None:
    """The length of the shortest prefix of ``tokens`` whose text contains one of ``stops``; None if none does.
    A prefix's text only grows with its length, so the search is binary (a few decodes per turn)."""
    if not stops or not any(s in tokenizer.decode(tokens) for s in stops):
        return None
    low, high = 1, len(tokens)  # the answer is in [low, high]
    while low < high:
        mid = (low + high) // 2
        if any(s in tokenizer.decode(tokens[:mid]) for s in stops):
            high = mid
        else:
            low = mid + 1
    return low


@dataclasses.dataclass
class _Episode:
    """One episode while it runs: its environment state, its tokens after the prompt, and how it ended."""

    state: Any
    prefix: list[int]
    segments: list[Segment] = dataclasses.field(default_factory=list)
    used: int = 0  # tokens after the prompt
    end: str | None = None


class EpisodeGenerator:
    """Episodes of ``env`` sampled with ``inner`` (any ``Generator``); a ``Generator`` itself."""

    def __init__(
        self, inner: Generator, env: EnvClient, tokenizer: PreTrainedTokenizerBase, cfg: EnvConfig, chat: ChatFormat
    ):
        self.inner, self.env, self.tokenizer, self.cfg, self.chat = inner, env, tokenizer, cfg, chat

    @property
    def version(self) -> int:
        return self.inner.version

    def describe(self) -> str:
        return f"{self.inner.describe()}; episodes of {self.cfg.class_} (at most {self.cfg.max_turns} turns)"

    def prepare(self) -> None:
        self.inner.prepare()

    def finish(self) -> None:
        self.inner.finish()

    def refit(self, trained: nn.Module, version: int) -> None:
        self.inner.refit(trained, version)

    def close(self) -> None:
        self.env.close()
        self.inner.close()

    def sample(self, request: SampleRequest) -> Experience:
        """``Generator.sample`` for episodes: rows ``[prompt | action | observation | ... | action | pad]`` with
        ``turn_ids``, ``step_rewards`` and ``episode_end`` (``types.build_episode_rows``). The request's rows reset
        the environment."""
        prompts = request.prompts
        if request.rows is None or len(request.rows) != len(prompts):
            raise ValueError("multi-turn episodes need each prompt's row to reset the environment with")
        ids = request.sample_ids.tolist()
        states = self.env.reset(request.rows, ids)
        episodes = [_Episode(state, list(prompt)) for state, prompt in zip(states, prompts)]
        for turn in range(1, self.cfg.max_turns + 1):
            active = [i for i, e in enumerate(episodes) if e.end is None]
            if not active:
                break
            answered = self._sample_turn(episodes, active, request, turn)
            results = self.env.step(
                [episodes[i].state for i in answered],
                [self.tokenizer.decode(episodes[i].segments[-1].tokens, skip_special_tokens=True) for i in answered],
                [ids[i] for i in answered],
            )
            for i, result in zip(answered, results):
                self._answer(episodes[i], turn, *result)
        ends = [EPISODE_ENDS.index(e.end) for e in episodes]
        rows = build_episode_rows(prompts, [e.segments for e in episodes], ends, self.tokenizer.pad_token_id)
        if observations_as_actions():  # the experiment's ablation (dtppo.faults): the masking bug, on purpose
            rows = rows.replace(response_mask=(rows.attention_mask.bool() & (rows.turn_ids > 0)).float())
        return rows

    def _sample_turn(self, episodes: list[_Episode], active: list[int], request: SampleRequest, turn: int) -> list[int]:
        """Turn ``turn`` (1-based) of each ``active`` episode of ``request``, appended to it: sampled with the
        turn's stream key, at most the episodes' remaining budget; returns the episodes the environment answers next
        (those whose turn ended at a stop)."""
        budgets = [self.cfg.max_total_tokens - episodes[i].used for i in active]
        params = request.params
        turn_max = min(params.max_new_tokens, max(budgets))
        # min_new_tokens is per turn, cut to the turn's budget like max_new_tokens.
        turn_params = dataclasses.replace(
            params, max_new_tokens=turn_max, min_new_tokens=min(params.min_new_tokens, turn_max)
        )
        prefixes = [episodes[i].prefix for i in active]
        turn_request = SampleRequest(prefixes, turn_params, turn_key(request.key, turn - 1), request.sample_ids[active])
        batch = self.inner.sample(turn_request)
        answered = []
        for j, (i, budget) in enumerate(zip(active, budgets)):
            mask = batch.response_mask[j].bool()
            tokens, logprobs = batch.input_ids[j][mask].tolist(), batch.gen_logprobs[j][mask].tolist()
            stopped = not bool(batch.truncated[j])
            cut = stop_string_cut(self.tokenizer, tokens, self.cfg.stop)
            if cut is not None:
                tokens, logprobs, stopped = tokens[:cut], logprobs[:cut], True
            if len(tokens) > budget:
                tokens, logprobs, stopped = tokens[:budget], logprobs[:budget], False
            episode = episodes[i]
            episode.segments.append(Segment(tokens, turn, logprobs))
            episode.prefix += tokens
            episode.used += len(tokens)
            if stopped:
                answered.append(i)
            else:
                episode.end = "max_total_tokens" if episode.used >= self.cfg.max_total_tokens else "truncated"
        return answered

    def _answer(
        self, episode: _Episode, turn: int, state: Any, observation: Observation, reward: float, done: bool
    ) -> None:
        """The environment's answer to the episode's last turn: its reward on that turn, then the end of the
        episode or the observation the next turn reads."""
        episode.state = state
        episode.segments[-1] = dataclasses.replace(episode.segments[-1], reward=reward)
        if done:
            episode.end = "env_done"
            return
        if turn == self.cfg.max_turns:
            episode.end = "max_turns"
            return
        tokens = observation_tokens(self.tokenizer, self.chat, observation, episode.segments[-1].tokens)
        tokens = tokens[: self.cfg.max_observation_tokens]
        if episode.used + len(tokens) >= self.cfg.max_total_tokens:  # no room left for another turn
            episode.end = "max_total_tokens"
            return
        if tokens:
            episode.segments.append(Segment(tokens, turn))
            episode.prefix += tokens
            episode.used += len(tokens)


def with_episodes(
    generator: Generator, env: EnvConfig, chat: ChatFormat, tokenizer: PreTrainedTokenizerBase
) -> Generator:
    """``generator`` itself for single-turn runs, else the episode loop around it (``env.class`` set), rendering chat
    observations as ``chat`` (``data``'s format) renders prompts."""
    if not env.multi_turn:
        return generator
    return EpisodeGenerator(generator, EnvClient(env), tokenizer, env, chat)
