"""ValueModel: any HF base model plus a scalar head, returning V(s_t) aligned to the state before token t."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig, AutoModel, PreTrainedModel

from dtppo.algorithms.advantages import right_shift_values
from dtppo.distributed.context import ContextShards
from dtppo.errors import InputError
from dtppo.models.attention import ContextRows, Segments, attention_implementation
from dtppo.models.context import ContextForward
from dtppo.models.critic_format import read_critic, write_critic
from dtppo.models.loading import loading_from
from dtppo.models.packing import needed_mask, pack_rows


class ValueModel(nn.Module):
    """Critic = backbone + ``score`` Linear(hidden, 1).

    backbone: an HF base model (e.g. ``Qwen2Model``) returning ``last_hidden_state``.
    seed: the head is drawn from its own generator seeded with ``seed``, so every launch, layout and
    process gets the same fresh head regardless of what consumed the global RNG before.
    shift: True gives V(s_t), the state before token t; False exists only for the value-alignment experiment.
    sequence_packing: :meth:`values` packs the batch's sequences into fewer rows (no pad tokens computed)
    and shifts within each sequence; the results equal the padded path's (dtppo.models.packing).
    head: (weight [1, H], bias [1] or None) to start from instead of a fresh head, e.g. a reward model's
    score head (:func:`reward_model_head`); a missing bias starts at 0. ``seed`` and ``init_std`` are then unused.
    shards: context parallelism (``models.context``): :meth:`values` runs this rank's tokens of each row and
    gathers the head's outputs into whole rows before the shift. None: whole rows.
    """

    def __init__(
        self,
        backbone: PreTrainedModel,
        seed: int = 0,
        init_std: float = 0.02,
        shift: bool = True,
        sequence_packing: bool = False,
        head: tuple[torch.Tensor, torch.Tensor | None] | None = None,
        shards: ContextShards | None = None,
    ):
        super().__init__()
        self.backbone = backbone
        self.shards = shards
        self.score = nn.Linear(backbone.config.hidden_size, 1)
        self.shift = shift
        self.sequence_packing = sequence_packing
        with torch.no_grad():
            if head is None:
                generator = torch.Generator().manual_seed(seed)
                self.score.weight.copy_(torch.randn(self.score.weight.shape, generator=generator) * init_std)
                self.score.bias.zero_()
            else:
                weight, bias = head
                self.score.weight.copy_(weight.reshape(self.score.weight.shape))
                self.score.bias.copy_(bias.reshape(1) if bias is not None else torch.zeros(1))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None = None,
        segments: Segments | None = None,
        context: ContextRows | None = None,
    ) -> torch.Tensor:
        """Head output at every position (unshifted). input_ids: [B, T]; attention_mask: [B, T] padding mask, or
        None for right-padded rows (causal attention never reaches their padding) and for packed rows with their
        position_ids [B, T] and ``segments`` (``models.packing``, ``models.attention``) -> [B, T] float32.
        context: the rows' sequences when ``input_ids`` are this rank's tokens of them (context parallelism)."""
        # No KV cache: the critic never decodes (and under activation checkpointing transformers would warn).
        extra = {} if segments is None else {"dtppo_segments": segments}
        if context is not None:
            extra["dtppo_context"] = context
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **extra
        ).last_hidden_state
        # A copy, not a view: FSDP2 cannot hook backward into a view of the root output.
        return self.score(hidden).squeeze(-1).to(torch.float32, copy=True)

    def values(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, packing: bool | None = None
    ) -> torch.Tensor:
        """V(s_t) for every position: the head's output at t-1, 0 at t=0. [B, T] -> [B, T] float32.

        packing: through packed rows or padded ones; None: ``sequence_packing``. Padding positions carry no
        meaning (0 when packed); callers mask them.
        """
        if not (self.sequence_packing if packing is None else packing):
            head = self._head(input_ids, needed_mask(attention_mask))
            return right_shift_values(head) if self.shift else head
        packed = pack_rows(input_ids, attention_mask)
        head = self._head(packed.input_ids, None, packed.position_ids, packed.segments, packed.sequence_starts)
        # The shift restarts at each sequence's first token: V(s_t) never comes from a neighbour sequence.
        return packed.unpack(right_shift_values(head, packed.sequence_starts) if self.shift else head)

    def _head(self, input_ids, attention_mask, position_ids=None, segments=None, sequence_starts=None) -> torch.Tensor:
        """The head's output on whole rows [B, T] (arguments as :meth:`forward`'s; sequence_starts [B, T] of packed
        rows), under context parallelism from this rank's tokens, gathered."""
        if self.shards is None:
            return self(input_ids, attention_mask, position_ids, segments)
        context = ContextForward.of(self.shards, input_ids, position_ids, sequence_starts, attention_mask)
        return context.gather(self(context.input_ids, None, context.position_ids, context=context.rows))

    def save_pretrained(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        """Write the critic as an HF directory that ``transformers`` loads, its weights in ``dtype`` (None: the
        backbone's). Where transformers has a token-classification class for the family, that model with
        ``num_labels=1``; else the backbone as an HF base model plus ``value_head.safetensors``
        (``dtppo.models.critic_format``). The model itself is left as it is."""
        write_critic(path, self.backbone, self.score, dtype or self.backbone.dtype)

    @classmethod
    def from_pretrained(cls, path: str | Path, shift: bool = True, sequence_packing: bool = False) -> ValueModel:
        """Load a critic written by :meth:`save_pretrained` (either layout; or any HF token-classification critic
        with one label) in float32, from safetensors only."""
        backbone, head = read_critic(path)
        return cls(backbone, shift=shift, sequence_packing=sequence_packing, head=head)


def build_backbone(path: str | None, config=None, seed: int = 0) -> PreTrainedModel:
    """A base model (no LM head) from ``path``, or randomly initialised from ``config`` with ``seed``; its attention
    is ``models.attention``'s choice."""
    if path is not None:
        with loading_from(path):
            config = AutoConfig.from_pretrained(path)
            return AutoModel.from_pretrained(
                path,
                config=config,
                dtype=torch.float32,
                attn_implementation=attention_implementation(config),
                use_safetensors=True,  # a pickled pytorch_model.bin could run code (models.loading.weights_refusal)
            )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        config._attn_implementation = attention_implementation(config)
        return AutoModel.from_config(config)


def reward_model_head(path: str | None) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """The ``score`` head of a sequence-classification directory with num_labels=1 (a reward model), else None.

    Returns (weight [1, H], bias [1] or None) in float32, read from the directory's safetensors (only those
    two tensors, never unpickling), so a critic can start from a reward model's backbone and head, as in
    TRL and OpenRLHF. None for no path, a hub name, or any other kind of model (a causal LM, a critic).
    """
    config_file = Path(path) / "config.json" if path is not None else None
    if config_file is None or not config_file.is_file():
        return None
    with loading_from(path):
        config = json.loads(config_file.read_text())
    is_reward_model = any(a.endswith("ForSequenceClassification") for a in config.get("architectures") or [])
    labels = len(config["id2label"]) if "id2label" in config else config.get("num_labels", 2)
    if not is_reward_model or labels != 1:
        return None
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as shard:
            names = set(shard.keys())
            tensors |= {key: shard.get_tensor(key) for key in ("score.weight", "score.bias") if key in names}
    if "score.weight" not in tensors:
        raise InputError(
            f"{path}: a reward model directory without a `score.weight` in *.safetensors; its "
            "head is read from safetensors only"
        )
    bias = tensors.get("score.bias")
    return tensors["score.weight"].float(), bias.float() if bias is not None else None
