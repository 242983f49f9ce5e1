"""The two layouts a critic is written in (``ValueModel.save_pretrained``, ``dtppo export``'s ``critic``) and read from.

``token-classification``, where transformers has a ``*ForTokenClassification`` class for the backbone's family whose
base model is the critic's backbone and whose head is one ``Linear(hidden, 1)`` (Qwen2, Qwen3, Llama, Mistral,
Gemma 2, GPT-2, ...): that model with ``num_labels=1``, which ``AutoModelForTokenClassification`` loads.

``base-model+value-head``, for every other family (Gemma 3, OLMo 2, Granite, Cohere, ...): the backbone as an HF base
model directory (``config.json`` and ``model.safetensors``: ``AutoModel.from_pretrained`` loads it), the head in
``value_head.safetensors`` (``score.weight`` [1, H], ``score.bias`` [1]) and ``value_head.json`` naming the layout.

Both hold safetensors only: reading either unpickles nothing. Which one a family gets is decided on meta-device
builds (no weights), so preflight can tell at start whether a critic can be written at all (:func:`export_refusal`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from transformers import (
    CONFIG_MAPPING,
    MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING,
    MODEL_MAPPING,
    AutoConfig,
    AutoModel,
    AutoModelForTokenClassification,
    PretrainedConfig,
    PreTrainedModel,
)

from dtppo.errors import InputError
from dtppo.models.loading import loading_from

TOKEN_CLASSIFICATION = "token-classification"
BASE_MODEL_AND_HEAD = "base-model+value-head"
HEAD_FILE = "value_head.safetensors"
MARKER_FILE = "value_head.json"


def export_layout(config: PretrainedConfig) -> str:
    """The layout of a critic whose backbone has ``config``: token classification where transformers' class for the
    family wraps this very backbone (same class, same tensors) with one ``Linear(hidden, 1)``, else base model and
    head."""
    if type(config) not in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING:
        return BASE_MODEL_AND_HEAD
    try:
        with torch.device("meta"):
            backbone = AutoModel.from_config(_copy(config))
            model = AutoModelForTokenClassification.from_config(_token_classification_config(config))
    except Exception:  # the family's class does not build from this config; the base-model layout needs AutoModel only
        return BASE_MODEL_AND_HEAD
    base = getattr(model, model.base_model_prefix, None)
    fits = type(base) is type(backbone) and _shapes(base) == _shapes(backbone) and _head_name(model) is not None
    return TOKEN_CLASSIFICATION if fits else BASE_MODEL_AND_HEAD


def export_refusal(config: PretrainedConfig) -> str | None:
    """Why no critic whose backbone has ``config`` can be built and written, or None. Builds on the meta device only.

    The base-model layout needs what training needs already (an ``AutoModel`` class and the ``hidden_size`` the head
    reads), and a ``config.json`` that transformers reads back as the same config class."""
    if type(config) not in MODEL_MAPPING:
        return f"transformers has no base model class (AutoModel) for {config.model_type}"
    if config.model_type not in CONFIG_MAPPING or CONFIG_MAPPING[config.model_type] is not type(config):
        return (
            f"a config.json of model_type {config.model_type} is not read back as {type(config).__name__}, "
            f"so AutoModel could not load the written backbone"
        )
    try:
        with torch.device("meta"):
            backbone = AutoModel.from_config(_copy(config))
    except Exception as err:  # transformers refuses a config in many ways; preflight reports each as one line
        detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return f"AutoModel cannot build it: {type(err).__name__}: {detail}"
    if not isinstance(getattr(backbone.config, "hidden_size", None), int):
        return (
            f"{type(backbone).__name__}'s config ({type(config).__name__}) has no hidden_size for the value head "
            f"(a composite config: start the critic from a text-only model of the family)"
        )
    return None


def write_critic(path: str | Path, backbone: PreTrainedModel, score: nn.Linear, dtype: torch.dtype) -> str:
    """Write the critic (``backbone`` and its ``score`` head, neither changed) to ``path`` with its weights in
    ``dtype`` (config.json names it), in :func:`export_layout`'s layout, which it returns."""
    layout = export_layout(backbone.config)
    if layout == TOKEN_CLASSIFICATION:
        model = _empty(AutoModelForTokenClassification, _token_classification_config(backbone.config), dtype)
        getattr(model, model.base_model_prefix).load_state_dict(backbone.state_dict())
        getattr(model, _head_name(model)).load_state_dict(score.state_dict())
        model.save_pretrained(str(path))
        for stale in (MARKER_FILE, HEAD_FILE):  # written over a base-model export, the marker would still claim it
            (Path(path) / stale).unlink(missing_ok=True)
        return layout
    base = _empty(AutoModel, _copy(backbone.config), dtype)
    base.load_state_dict(backbone.state_dict())
    base.save_pretrained(str(path))
    head = {f"score.{name}": tensor.detach().to(dtype).contiguous() for name, tensor in score.state_dict().items()}
    save_file(head, str(Path(path) / HEAD_FILE), metadata={"format": "pt"})
    marker = {
        "layout": BASE_MODEL_AND_HEAD,
        "backbone": "this directory: AutoModel.from_pretrained(it).last_hidden_state [B, T, H]",
        "head": {"file": HEAD_FILE, "tensors": {"score.weight": [1, score.in_features], "score.bias": [1]}},
        "values": "Linear(H, 1) of the hidden state at t, squeezed: the value of the state after token t",
        "dtype": str(dtype).removeprefix("torch."),
    }
    (Path(path) / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
    return layout


def read_critic(path: str | Path) -> tuple[PreTrainedModel, tuple[torch.Tensor, torch.Tensor | None]]:
    """(backbone, (head weight [1, H], head bias [1] or None)) in float32 from a critic directory of either layout,
    from its safetensors alone (``use_safetensors``: a ``pytorch_model.bin`` beside them is never unpickled)."""
    path = Path(path)
    if (path / MARKER_FILE).is_file():
        layout = json.loads((path / MARKER_FILE).read_text()).get("layout")
        if layout != BASE_MODEL_AND_HEAD:
            raise InputError(
                f"{path / MARKER_FILE}: an unknown critic layout {layout!r} (this dtppo reads "
                f"{BASE_MODEL_AND_HEAD!r} and {TOKEN_CLASSIFICATION!r})"
            )
        with loading_from(str(path)):
            backbone = AutoModel.from_pretrained(str(path), dtype=torch.float32, use_safetensors=True)
            with safe_open(str(path / HEAD_FILE), framework="pt") as head:
                weight, bias = head.get_tensor("score.weight"), head.get_tensor("score.bias")
        return backbone, (weight.float(), bias.float())
    with loading_from(str(path)):
        model = AutoModelForTokenClassification.from_pretrained(str(path), dtype=torch.float32, use_safetensors=True)
    head = getattr(model, _head_name(model))
    bias = head.bias.detach() if head.bias is not None else None
    return getattr(model, model.base_model_prefix), (head.weight.detach(), bias)


def is_exported_critic(path: Path) -> bool:
    """Whether ``path`` holds a critic in one of the two layouts (else, e.g., a dtppo checkpoint)."""
    if (path / MARKER_FILE).is_file():
        return True
    config = path / "config.json"
    if not config.is_file():
        return False
    architectures = json.loads(config.read_text()).get("architectures") or []
    return any(name.endswith("ForTokenClassification") for name in architectures)


def _token_classification_config(config: PretrainedConfig) -> PretrainedConfig:
    """A copy of the backbone's config for its family's token-classification class: one label, the value."""
    copied = _copy(config)
    copied.num_labels = 1
    copied.id2label, copied.label2id = {0: "value"}, {"value": 0}
    return copied


def _copy(config: PretrainedConfig) -> PretrainedConfig:
    """A fresh config equal to ``config``: building a model from it leaves the caller's config untouched."""
    return AutoConfig.for_model(**config.to_dict())


def _empty(auto_class, config: PretrainedConfig, dtype: torch.dtype) -> PreTrainedModel:
    """A model of ``config`` in ``dtype`` with uninitialised weights, to be overwritten: built on the meta device, so
    no time is spent drawing (and no global RNG consumed by) random weights that are replaced at once."""
    with torch.device("meta"):
        model = auto_class.from_config(config, dtype=dtype)
    return model.to_empty(device="cpu")


def _head_name(model: nn.Module) -> str | None:
    """A token-classification model's head (``score``, or ``classifier`` in GPT-2-style classes): its one
    ``Linear(hidden, 1)`` child."""
    heads = [name for name, child in model.named_children() if isinstance(child, nn.Linear) and child.out_features == 1]
    return heads[0] if len(heads) == 1 else None


def _shapes(model: nn.Module | None) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in model.state_dict().items()} if model is not None else {}
