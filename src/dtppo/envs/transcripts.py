"""SFT on episodes: a worked solution written as a whole transcript (assistant turns with the environment's
observations between them) split back into turns, so that SFT trains on the assistant's tokens only, as PPO does.

A solution's assistant turn ends at the first of ``env.stop``'s strings; the environment steps on it, and the text
that follows in the solution must be its observation, verbatim (so the transcript is one the environment would
produce); the rest after the last stop string is the final turn, trained with EOS. A solution without a stop string
is one turn. An observation given as chat messages is not written in the solution (its text is the chat template's,
with special tokens no dataset holds): its tokens are those an episode appends for it (``envs.observations``), and the
solution goes on with the next turn; so does it after no observation (None).
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from dtppo.data.chat import ChatFormat
from dtppo.data.problem import Problem
from dtppo.envs.client import EnvClient
from dtppo.envs.interface import Observation, episode_row
from dtppo.envs.observations import observation_tokens
from dtppo.errors import InputError
from dtppo.types import Segment


def _follows(observation: Observation, rest: str) -> bool:
    """Whether the solution's ``rest`` can follow the environment's answer: a text observation must start it; chat
    messages (or none) are not written in it."""
    return rest.startswith(observation) if isinstance(observation, str) else True


def _first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """The end of the first stop string in ``text``, or None."""
    ends = [text.find(s) + len(s) for s in stops if s in text]
    return min(ends) if ends else None


def transcript_episodes(
    tokenizer: PreTrainedTokenizerBase,
    chat: ChatFormat,
    env: EnvClient,
    stops: tuple[str, ...],
    problems: list[Problem],
    ids: list[int],
) -> list[list[Segment]]:
    """Each problem's solution as episode segments (``types.Segment``; action segments with zero log-probs, the
    last one ending with EOS), chat observations rendered as ``chat`` says. ids: the problems' sample indices (named
    in errors). Raises InputError when the text after a turn is not the environment's text observation or the
    environment ends an episode the solution goes on."""
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    states = env.reset([episode_row(p) for p in problems], ids)
    rests = [p.solution for p in problems]
    episodes: list[list[Segment]] = [[] for _ in problems]
    pending = list(range(len(problems)))
    while pending:
        stepping, texts = [], []
        for i in pending:
            cut, turn = _first_stop(rests[i], stops), len(episodes[i]) // 2 + 1
            if cut is None:  # the final turn
                tokens = encode(rests[i]) + [tokenizer.eos_token_id]
                episodes[i].append(Segment(tokens, turn, [0.0] * len(tokens)))
                continue
            texts.append(rests[i][:cut])
            rests[i] = rests[i][cut:]
            stepping.append(i)
        answers = env.step([states[i] for i in stepping], texts, [ids[i] for i in stepping])
        for i, text, (state, observation, _, done) in zip(stepping, texts, answers):
            turn = len(episodes[i]) // 2 + 1
            if done or not _follows(observation, rests[i]):
                raise InputError(
                    f"SFT solution of sample {ids[i]}: after its turn {turn} ({text[-40:]!r}) the environment "
                    f"{'ended the episode' if done else f'answers {observation!r:.60}'}, but the solution goes on "
                    f"with {rests[i][:60]!r}"
                )
            states[i] = state
            tokens = encode(text)
            observed = observation_tokens(tokenizer, chat, observation, tokens)
            episodes[i] += [Segment(tokens, turn, [0.0] * len(tokens)), Segment(observed, turn)]
            rests[i] = rests[i][len(observation) :] if isinstance(observation, str) else rests[i]
        pending = stepping
    return episodes
