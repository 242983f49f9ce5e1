"""A process reward model (PRM): an HF directory scoring each step of a completion, as step rewards.

A completion's steps are its non-blank pieces between ``separator``s. The PRM reads the question and the
completion, with ``step_tag`` after each step when one is set, and is read at one token per step: the token that
holds the step's last character, or its tag's. Two heads (Lightman et al. 2023, arXiv 2305.20050; Wang et al.
2024, Math-Shepherd, arXiv 2312.08935): a token-classification head (the sigmoid of one label, or the second
label's probability of two), or a causal LM read at each tag, the probability of ``good_token`` against
``bad_token``. Each step's score is its reward, placed where the step ends in the completion.

The PRM is causal: what it reads at a step depends on the text up to there, so one forward pass scores every step
(tested against scoring each step's prefix alone). Weights are read from safetensors only (``rewards.model``).
"""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification, PreTrainedTokenizerBase

from dtppo.config import ProcessModelConfig
from dtppo.data.chat import conversation
from dtppo.data.problem import Prompt
from dtppo.models.loading import loading_from
from dtppo.models.packing import needed_mask
from dtppo.models.tokenizer import load_tokenizer
from dtppo.rewards.functions import Steps
from dtppo.rewards.model import checked_directory, named_key, refusal, template_text

KEY = "reward.process_model.path"


def step_spans(completion: str, separator: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of each non-blank step of ``completion``, the steps cut at ``separator``
    (which belongs to no step), in order."""
    spans, start = [], 0
    for piece in completion.split(separator):
        end = start + len(piece)
        if piece.strip():
            spans.append((start, end))
        start = end + len(separator)
    return spans


def tagged(completion: str, spans: list[tuple[int, int]], tag: str | None) -> tuple[str, list[int]]:
    """The completion with ``tag`` after each step (unchanged for no tag), and where each step is read in it: the
    offset just after the step, or after its tag."""
    if tag is None:
        return completion, [end for _, end in spans]
    text, reads, done = [], [], 0
    for _, end in spans:
        text += [completion[done:end], tag]
        done = end
        reads.append(end + len(tag) * len(reads) + len(tag))
    return "".join(text + [completion[done:]]), reads


def rendered(
    tokenizer: PreTrainedTokenizerBase, prompt: Prompt, content: str, system_prompt: str | None
) -> tuple[str, int]:
    """The PRM's input text and where ``content`` (the tagged completion) starts in it: the conversation through
    the tokenizer's chat template, or for a tokenizer without one (Math-Shepherd's), the question, a space and the
    completion."""
    if tokenizer.chat_template:
        messages = conversation(prompt, system_prompt) + [{"role": "assistant", "content": content}]
        text = template_text(tokenizer, messages)
        start = text.rfind(content)
        if start < 0:
            raise ValueError("the PRM's chat template changes the completion's text, so its steps cannot be found")
        return text, start
    question = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
    return f"{question} {content}", len(question) + 1


def read_tokens(starts: torch.Tensor, chars: torch.Tensor) -> torch.Tensor:
    """starts: [T] each token's first character, in order; chars: [S] character indices -> [S] the index of the
    token holding each character: the last to start at or before it (a character split over byte tokens: the one
    completing it; whitespace a tokenizer trims from its offsets: the token before)."""
    return (starts[None, :] <= chars[:, None]).sum(-1) - 1


class ProcessRewardModel:
    """A frozen PRM on ``device`` (float32 on CPU, bfloat16 on CUDA); a failure to use ``cfg.path`` is an
    ``InputError`` of one line naming ``reward.process_model.path``."""

    def __init__(self, cfg: ProcessModelConfig, system_prompt: str | None, device: torch.device):
        self.cfg, self.system_prompt, self.device = cfg, system_prompt, device
        path = checked_directory(KEY, cfg.path, "a process reward model", "a local HF model directory")
        with named_key(KEY), loading_from(path):
            config = AutoConfig.from_pretrained(path)
        with named_key(KEY):
            self.tokenizer = load_tokenizer(path)
        if not self.tokenizer.is_fast:
            raise refusal(KEY, path, "its tokenizer is not a fast tokenizer, so it gives no character offsets")
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else config.pad_token_id
        if self.pad_id is None:
            raise refusal(KEY, path, "neither its config nor its tokenizer names a padding token")
        self.candidates = self._candidates(path) if cfg.head == "causal_lm" else None
        if cfg.head == "token_classification" and config.num_labels not in (1, 2):
            raise refusal(KEY, path, f"a token-classification PRM has 1 or 2 labels, this one {config.num_labels}")
        auto = AutoModelForCausalLM if cfg.head == "causal_lm" else AutoModelForTokenClassification
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        with named_key(KEY), loading_from(path):
            model = auto.from_pretrained(path, config=config, use_safetensors=True, dtype=dtype)
        self.model = model.to(device).eval().requires_grad_(False)

    def _candidates(self, path: str) -> torch.Tensor:
        """[2] the ids of ``good_token`` and ``bad_token``, each one token of the PRM's vocabulary."""
        ids = []
        for name in ("good_token", "bad_token"):
            text = getattr(self.cfg, name)
            encoded = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(encoded) != 1:
                raise refusal(KEY, path, f"reward.process_model.{name} {text!r} is {len(encoded)} tokens, not one")
            ids += encoded
        return torch.tensor(ids)

    @torch.no_grad()
    def score(self, prompts: list[Prompt], completions: list[str]) -> list[Steps | None]:
        """Each completion's steps as (end, score) pairs, ``end`` the character offset just after the step in the
        completion; None for a completion with no step. Batches of ``batch_size`` give the scores of one at a
        time."""
        scores: list[Steps | None] = []
        for start in range(0, len(completions), self.cfg.batch_size):
            chunk = range(start, min(start + self.cfg.batch_size, len(completions)))
            scores += self._score_chunk([prompts[i] for i in chunk], [completions[i] for i in chunk])
        return scores

    def _score_chunk(self, prompts: list[Prompt], completions: list[str]) -> list[Steps | None]:
        rows, reads, spans = [], [], []
        for prompt, completion in zip(prompts, completions):
            spans.append(step_spans(completion, self.cfg.separator))
            content, ends = tagged(completion, spans[-1], self.cfg.step_tag)
            text, offset = rendered(self.tokenizer, prompt, content, self.system_prompt)
            encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            starts = torch.tensor([start for start, _ in encoded["offset_mapping"]], dtype=torch.long)
            tokens = read_tokens(starts, torch.tensor(ends, dtype=torch.long) + offset - 1)
            cut = max(len(encoded["input_ids"]) - self.cfg.max_length, 0)  # keep the last max_length tokens
            rows.append(encoded["input_ids"][cut:])
            reads.append(torch.where(tokens >= cut, tokens - cut, -1))
        probs = self._read_probs(rows, reads)
        out, done = [], 0
        for row_spans, row_reads in zip(spans, reads):
            steps = [(end, float(probs[done + j])) for j, (_, end) in enumerate(row_spans) if int(row_reads[j]) >= 0]
            done += len(row_spans)
            out.append(tuple(steps) if steps else None)
        return out

    def _read_probs(self, rows: list[list[int]], reads: list[torch.Tensor]) -> torch.Tensor:
        """The PRM's probability that each step is correct, read at ``reads`` ([S_i] token indices per row, -1 for
        a step cut away) -> [sum S_i] float32 (any value where cut away)."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row, dtype=torch.long), 1
        row_of = torch.cat([torch.full((len(r),), i) for i, r in enumerate(reads)])
        at = torch.cat(reads).clamp(min=0)
        if at.numel() == 0:
            return torch.zeros(0)
        ids, mask = ids.to(self.device), mask.to(self.device)
        if self.candidates is None:
            logits = self.model(input_ids=ids, attention_mask=needed_mask(mask)).logits[row_of, at].float()
            return (torch.sigmoid(logits[:, 0]) if logits.shape[-1] == 1 else logits.softmax(-1)[:, 1]).cpu()
        backbone = getattr(self.model, self.model.base_model_prefix)
        hidden = backbone(input_ids=ids, attention_mask=needed_mask(mask)).last_hidden_state[row_of, at]
        # Only the two candidates' logits, from the gathered states: the full [B, T, V] logits are never built.
        head = self.model.get_output_embeddings()
        logits = (hidden @ head.weight[self.candidates.to(self.device)].T).float()
        if getattr(head, "bias", None) is not None:
            logits = logits + head.bias[self.candidates.to(self.device)].float()
        return logits.softmax(-1)[:, 0].cpu()
