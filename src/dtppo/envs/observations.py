"""How an environment's observation enters an episode's tokens, in PPO's episodes (``generation.episodes``) and in
SFT's transcripts (``envs.transcripts``) alike: text as it is; chat messages as the text the policy's chat template
renders for them after the assistant's turn (``data.chat.ChatFormat.turn_text``)."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from dtppo.data.chat import ChatFormat
from dtppo.envs.interface import EnvironmentFailure, Observation


def observation_tokens(
    tokenizer: PreTrainedTokenizerBase, chat: ChatFormat, observation: Observation, turn: list[int]
) -> list[int]:
    """Token ids of an observation after the assistant turn ``turn`` (its token ids): none for None or an empty one;
    text as it is; chat messages as the text the chat template renders for them after the turn
    (``ChatFormat.turn_text``: the turn's closing unless the turn sampled it, the messages, the next generation
    prompt). Raises EnvironmentFailure when the template cannot give that text."""
    if not observation:
        return []
    if isinstance(observation, str):
        return tokenizer(observation, add_special_tokens=False)["input_ids"]
    try:
        text = chat.turn_text(tokenizer, observation, turn[-1] if turn else None)
    except Exception as err:  # the template's own refusal (a role it does not know) or TurnTextError: one line
        detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise EnvironmentFailure(
            f"an observation given as chat messages ({observation!r:.80}) cannot be rendered with the policy's chat "
            f"template: {type(err).__name__}: {detail} (give the observation as text)"
        ) from None
    return tokenizer(text, add_special_tokens=False)["input_ids"]
