"""A learned reward model: an HF sequence-classification directory (num_labels=1) scoring whole conversations.

As in TRL and OpenRLHF the RM is a decoder with a per-position linear ``score`` head, read at each
conversation's last real token. It has its own tokenizer and chat template, so it scores the text the policy
wrote, never the policy's token ids. It is only ever evaluated (eval mode, no gradients).

Weights are loaded from safetensors only: a ``pytorch_model.bin`` is a pickle, and unpickling a file named in
a config could run code, so such a directory is refused before anything is read from it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, PreTrainedModel, PreTrainedTokenizerBase

from dtppo.config import RewardModelConfig
from dtppo.errors import InputError
from dtppo.models.loading import loading_from, weights_refusal
from dtppo.models.packing import needed_mask
from dtppo.models.tokenizer import load_tokenizer

KEY = "reward.model.path"

Conversation = list[dict]


@contextmanager
def named_key(key: str) -> Iterator[None]:
    """Prefix a loading failure's one line (it names the path) with the config key ``key``."""
    try:
        yield
    except InputError as err:
        raise InputError(f"{key}: {err}") from err


def refusal(key: str, path: str, why: str) -> InputError:
    return InputError(f"{key}: {path}: {why}")


def checked_directory(key: str, path: str | None, model: str, form: str) -> str:
    """``path`` (the value of config key ``key``) when it is a local directory with safetensors weights, checked
    before anything is loaded; ``model`` ("a reward model") and ``form`` (what its directory is) word the
    refusals."""
    if path is None:
        raise InputError(f"{key} is not set")
    directory = Path(path)
    if not directory.is_dir():
        raise refusal(key, path, f"not a directory ({model} is {form})")
    refused = weights_refusal(directory, model)
    if refused is not None:
        raise refusal(key, path, refused)
    return path


def template_text(tokenizer: PreTrainedTokenizerBase, conversation: Conversation) -> str:
    """``conversation`` as text through a reward model's own chat template (not the policy's: ``data.chat``)."""
    return tokenizer.apply_chat_template(conversation, tokenize=False)


def encode_conversations(
    tokenizer: PreTrainedTokenizerBase, conversations: list[Conversation], max_length: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Render each conversation with the RM's chat template and right-pad the token ids.

    A conversation longer than ``max_length`` tokens keeps its last ``max_length``: the completion (the part
    being judged) is at the end. Returns input_ids [B, T] long, attention_mask [B, T] long and last [B] long,
    the index of each row's last real token.
    """
    rows = []
    for conv in conversations:
        text = template_text(tokenizer, conv)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][-max_length:]
        if not ids:
            raise ValueError("a conversation renders to no RM tokens; it has nothing to score")
        rows.append(ids)
    width = max(len(ids) for ids in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, ids in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, : len(ids)] = 1
    # Right padding: the real tokens are a prefix, so the last one sits at length - 1.
    return input_ids, attention_mask, attention_mask.sum(-1) - 1


def last_token_scores(
    model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, last: torch.Tensor
) -> torch.Tensor:
    """The ``score`` head applied to the backbone's hidden state at each row's last real token.

    input_ids, attention_mask: [B, T] right-padded; last: [B] index of the last real token -> [B] in the
    model's dtype. HF's own pooling finds that token by searching for ``pad_token_id`` in input_ids, which
    misplaces it when the pad id is also a real token (a tokenizer padding with EOS); ``last`` comes from the
    mask instead. The head is per-position and linear, so applying it to the one gathered hidden state equals
    gathering the per-position logits, without computing T - 1 unused ones.
    """
    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(input_ids=input_ids, attention_mask=needed_mask(attention_mask)).last_hidden_state
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    return model.score(hidden[rows, last.to(hidden.device)]).squeeze(-1)


class RewardModel:
    """A frozen reward model on ``device`` (float32 on CPU, bfloat16 on CUDA).

    Every failure to use ``cfg.path`` is an ``InputError`` of one line naming ``reward.model.path``.
    """

    def __init__(self, cfg: RewardModelConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        path = checked_directory(KEY, cfg.path, "a reward model", "a local HF sequence-classification directory")
        with named_key(KEY), loading_from(path):
            config = AutoConfig.from_pretrained(path)
        if config.num_labels != 1:
            raise refusal(
                KEY,
                path,
                f"a reward model has num_labels=1 (one score), this config has num_labels={config.num_labels}",
            )
        with named_key(KEY):
            self.tokenizer = load_tokenizer(path)
        if not self.tokenizer.chat_template:
            raise refusal(KEY, path, "its tokenizer has no chat template, so conversations cannot be rendered for it")
        # Any pad id works (the last real token comes from the mask), but one must exist to fill a batch.
        # load_tokenizer already falls back to the EOS token, so this fails only when both are missing.
        pad_id = self.tokenizer.pad_token_id
        self.pad_id = pad_id if pad_id is not None else config.pad_token_id
        if self.pad_id is None:
            raise refusal(
                KEY,
                path,
                "neither its config (pad_token_id) nor its tokenizer (pad or eos token) names a padding token",
            )
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        with named_key(KEY), loading_from(path):
            model = AutoModelForSequenceClassification.from_pretrained(
                path, config=config, use_safetensors=True, dtype=dtype
            )
        if not isinstance(getattr(model, "score", None), torch.nn.Linear):
            raise refusal(
                KEY,
                path,
                f"{type(model).__name__} has no linear `score` head read at the last token "
                "(a decoder reward model, as TRL and OpenRLHF train them)",
            )
        self.model = model.to(device).eval().requires_grad_(False)

    @torch.no_grad()
    def score(self, conversations: list[Conversation]) -> torch.Tensor:
        """One score per conversation (a full message list ending with the assistant turn).

        Returns [B] float32 on the CPU; batches of ``batch_size`` give the same scores as one at a time.
        """
        scores = [torch.zeros(0)]
        for start in range(0, len(conversations), self.cfg.batch_size):
            chunk = conversations[start : start + self.cfg.batch_size]
            ids, mask, last = encode_conversations(self.tokenizer, chunk, self.cfg.max_length, self.pad_id)
            out = last_token_scores(self.model, ids.to(self.device), mask.to(self.device), last)
            scores.append(out.float().cpu())
        return torch.cat(scores)
