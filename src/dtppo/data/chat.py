"""Prompt formatting: the policy's chat template as a run renders it. ``ChatFormat.render`` is the one call of it in
dtppo, with ``data.system_prompt`` and ``data.chat_template_kwargs``, for prompts (``format_prompt``,
``encode_prompts``), SFT rows, validation, the observation turns of episodes and preflight's check. (A reward
model renders with its own template: ``rewards.model``.)

**The text of an observation turn.** An environment's observation given as chat messages enters an episode as the
template's own text for it: what the template renders after an assistant message's content, through the
observation's messages, up to and including the next generation prompt, so the text between two turns is what the
template renders for that conversation (Qwen's ``<|im_end|>\\n`` closing the assistant turn, the tool turn, then
``<|im_start|>assistant\\n``, with ``<think>\\n\\n</think>\\n\\n`` when ``enable_thinking`` is false). It is found by
rendering a neutral conversation whose last assistant message is a marker, and cutting after the marker. A turn
that ended on a special token the closing starts with (the sampled ``<|im_end|>``) already holds it, and the text
goes on after it. The text may not depend on the conversation before the assistant turn: it is rendered after two
different neutral conversations, and a template that renders the two differently (one that numbers its rounds)
cannot give it (``TurnTextError``). What a template renders for the earlier turns themselves is not asked of it:
Qwen3's drops an empty ``<think>`` block from an assistant message that is not the last, and dtppo keeps the tokens
each turn was sampled after (docs/guides/episodes.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from dtppo.config import DataConfig
from dtppo.data.problem import Problem, Prompt

Messages = list[dict[str, Any]]

_MARK = "dtppo-assistant-turn-0d5c"  # an assistant message's whole content: no spaces (templates trim), no tags
_CONTEXTS: tuple[Messages, ...] = (
    [{"role": "user", "content": "q"}],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "r"}],
)


class TurnTextError(ValueError):
    """The chat template cannot give the text of an observation turn consistently; the message says why."""


@dataclass(frozen=True)
class ChatFormat:
    """How a run renders conversations with the policy's chat template (``ChatFormat.of(cfg.data)``)."""

    system_prompt: str | None = None
    template_kwargs: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, data: DataConfig) -> ChatFormat:
        return cls(data.system_prompt, data.chat_template_kwargs)

    def render(self, tokenizer: PreTrainedTokenizerBase, messages: Messages, *, add_generation_prompt: bool) -> str:
        """``messages`` through ``tokenizer``'s chat template, with the run's template variables."""
        return tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False, **dict(self.template_kwargs)
        )

    def turn_text(self, tokenizer: PreTrainedTokenizerBase, observation: Messages, turn_end: int | None) -> str:
        """The text ``observation`` (chat messages) adds after an assistant turn whose last token is ``turn_end``
        (None: not known), up to and including the next generation prompt. Raises TurnTextError, or what the
        template raises for the messages (a role it refuses)."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        texts = [self._after_assistant(tokenizer, system + context, observation) for context in _CONTEXTS]
        if texts[0] != texts[1]:
            raise TurnTextError(
                f"what it renders after an assistant message depends on the conversation before it ({texts[0]!r:.80} "
                f"after one exchange, {texts[1]!r:.80} after two)"
            )
        text = texts[0]
        if turn_end is not None and turn_end in tokenizer.all_special_ids:
            end, rest = tokenizer.decode([turn_end]), text.lstrip()
            if end and rest.startswith(end):  # the turn's own closing token, sampled: the text goes on after it
                text = rest[len(end) :]
        return text

    def _after_assistant(self, tokenizer: PreTrainedTokenizerBase, context: Messages, observation: Messages) -> str:
        messages = context + [{"role": "assistant", "content": _MARK}] + observation
        rendered = self.render(tokenizer, messages, add_generation_prompt=True)
        if rendered.count(_MARK) != 1:
            raise TurnTextError("it does not render an assistant message's text as it is")
        return rendered[rendered.index(_MARK) + len(_MARK) :]


def prompt_length(tokenizer: PreTrainedTokenizerBase, chat: ChatFormat):
    """Tokens of a prompt, counted exactly as ``encode_prompts`` encodes it."""

    def length(prompt: Prompt) -> int:
        text = format_prompt(tokenizer, prompt, chat)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return length


def conversation(prompt: Prompt, system_prompt: str | None) -> list[dict[str, str]]:
    """The prompt as chat messages: a text prompt is the user turn; ``system_prompt`` goes first unless the
    messages bring their own system turn."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def format_prompt(tokenizer: PreTrainedTokenizerBase, prompt: Prompt, chat: ChatFormat) -> str:
    """The prompt text through the tokenizer's chat template (ours or the model's), with ``chat``'s system prompt
    and template variables, ending with the generation prompt."""
    return chat.render(tokenizer, conversation(prompt, chat.system_prompt), add_generation_prompt=True)


def encode_prompts(tokenizer: PreTrainedTokenizerBase, problems: list[Problem], data: DataConfig) -> list[list[int]]:
    """Token ids of each prompt, rendered as ``data`` says (``system_prompt``, ``chat_template_kwargs``); a prompt
    over ``data.max_prompt_tokens`` keeps its last ``max_prompt_tokens`` tokens."""
    chat = ChatFormat.of(data)
    texts = [format_prompt(tokenizer, p.question, chat) for p in problems]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [row[-data.max_prompt_tokens :] for row in ids]
