"""One line, naming the path, for a model or tokenizer that cannot be loaded; dropout off for RL training."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from torch import nn

from dtppo.errors import InputError


@contextmanager
def loading_from(path: str) -> Iterator[None]:
    """Turn a failure of ``from_pretrained(path)`` into an ``InputError`` naming ``path``."""
    try:
        yield
    # transformers refuses a directory in many ways (no or broken config.json, unknown architecture, missing or
    # corrupt weights, a hub name without network): each becomes one line; DTPPO_DEBUG=1 shows the traceback.
    except Exception as err:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise InputError(f"{path}: cannot load a model or tokenizer from it: {type(err).__name__}: {detail}") from err


def weights_refusal(path: str | Path, model: str) -> str | None:
    """Why the weights of the model directory ``path`` are not read (``model`` names what it holds, e.g. "a reward
    model"), or None when they are in safetensors. A ``pytorch_model.bin`` is a pickle, and unpickling a file a recipe
    names could run code. Asked before anything is read from the directory: by preflight for the policy's and the
    critic's, by ``rewards.model`` for a reward model's."""
    directory = Path(path)
    if any(directory.glob("*.safetensors")):
        return None
    found = sorted(p.name for p in directory.glob("*.bin")) or ["no weights"]
    return (
        f"no *.safetensors weights (found: {', '.join(found)}); {model} is loaded from safetensors only, never "
        "unpickled: convert it where you trust the file (from_pretrained, then save_pretrained writes safetensors)"
    )


def disable_dropout(model: nn.Module) -> nn.Module:
    """Every dropout of ``model`` set to 0, in place: ``nn.Dropout`` modules and HF attention's own
    ``attention_dropout`` rate. PPO's ratio compares the same policy's log-probs in two passes (π_old without
    grad, π in training mode); dropout would draw other masks in each, so the ratio would differ from 1 before any
    update (TRL's ``disable_dropout``, on by default). Qwen2 and Llama have none; GPT-2 has 0.1 in three places."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
    return model
