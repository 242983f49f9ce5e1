"""Activation checkpointing per decoder block: training keeps each block's input and recomputes the rest in backward.

Through transformers' own switch (``gradient_checkpointing_enable``): each decoder block (a
``GradientCheckpointingLayer``) then runs its ``__call__`` under ``torch.utils.checkpoint`` with
``use_reentrant=False``. Nothing is wrapped or renamed, so parameter names stay the HF names that checkpoints,
the HF export, the tied-name logic (``models.ties``) and the vLLM refit rely on. It composes with FSDP2 and
TP(+SP) applied afterwards: the block's hooks (FSDP's all-gather, TP's layout changes) run inside the checkpointed
call, FSDP skips its own during the recompute (its pre-backward hook has gathered the block already), and TP's run
again. Only in training mode: ``eval()`` forwards (log-probs, values, generation) keep nothing to recompute anyway.
Recompute repeats the forward exactly (dropout is off in the workers), so results do not change.
"""

from __future__ import annotations

from torch import nn
from transformers import PreTrainedModel


def recompute_blocks(model: nn.Module) -> nn.Module:
    """In place: activation checkpointing on every decoder block of ``model``, an HF model or a module holding one
    (the critic's ValueModel: its backbone). Raises ValueError for a model transformers cannot checkpoint (its
    class's ``supports_gradient_checkpointing`` is False; ``preflight`` refuses those first, ``model_checks``)."""
    hf = next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)
    if hf is None:
        raise ValueError(f"activation checkpointing: {type(model).__name__} holds no transformers model")
    hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model
