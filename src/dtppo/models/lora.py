"""LoRA adapters (Hu et al. 2021, arXiv:2106.09685) through PEFT: added to a policy or a critic backbone, switched
off for the KL reference, merged into plain weights for a generator or an export, and read and written in PEFT's
adapter format (``adapter_config.json`` + ``adapter_model.safetensors``).

Adapters are injected into the HF model in place (``peft.inject_adapter_in_model``), not wrapped in a
``PeftModel``: module paths stay the HF ones, so FSDP2 finds the decoder blocks, activation checkpointing and the
tied-name logic work unchanged, and the critic's value head, which is not part of the backbone, is never a PEFT
module (verl and SkyRL crashed, or left the head frozen, by giving PEFT a causal-LM task type for a critic).
PEFT is imported only where adapters are built or saved: a run without them never loads it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from dtppo.config import LoraConfig
from dtppo.errors import InputError

ADAPTER = "default"  # PEFT's name for a model's one adapter
ADAPTER_PARAMS = (f".lora_A.{ADAPTER}.weight", f".lora_B.{ADAPTER}.weight")  # how an adapter's tensors' names end
_PEFT_PREFIX = "base_model.model."  # what PeftModel puts before the base model's parameter names on disk
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


def peft_config(lora: LoraConfig, task_type: str | None = None):
    """PEFT's LoraConfig for ``lora`` (a fresh one each time: PEFT resolves ``all-linear`` in place)."""
    from peft import LoraConfig as PeftLoraConfig

    targets = "all-linear" if lora.target_modules == ("all-linear",) else list(lora.target_modules)
    return PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        bias="none",
        task_type=task_type,
    )


def add_adapters(model: nn.Module, lora: LoraConfig, seed: int) -> nn.Module:
    """In place: LoRA layers on ``lora.target_modules`` of the HF model ``model``, every other parameter frozen.
    A is drawn from a generator seeded with ``seed`` (the same adapter on every rank and launch), B = 0 so the model
    starts unchanged; or both come from ``lora.adapter_path``. Returns ``model``."""
    from peft import inject_adapter_in_model

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        inject_adapter_in_model(peft_config(lora), model, adapter_name=ADAPTER)
    if lora.adapter_path is not None:
        load_adapter(model, lora)
    return model


def adapted_layers(model: nn.Module) -> dict[str, nn.Module]:
    """{module path: module} of every layer holding an adapter (PEFT's wrappers: ``base_layer`` + ``lora_A``)."""
    return {name: m for name, m in model.named_modules() if hasattr(m, "base_layer") and hasattr(m, "lora_A")}


def describe(model: nn.Module, lora: LoraConfig) -> str:
    """One line for the run's start: the adapters and how much of the model trains."""
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return (
        f"LoRA rank {lora.rank}, alpha {lora.alpha:g} on {len(adapted_layers(model))} layers "
        f"({', '.join(lora.target_modules)}): {trained:,} of {total:,} parameters train ({100 * trained / total:.2f} %)"
    )


def delta_weight(layer: nn.Module, lora_a: torch.Tensor, lora_b: torch.Tensor) -> torch.Tensor:
    """What the adapter adds to the layer's weight: (alpha / r)·B·A, transposed for a GPT-2 ``Conv1D`` (its weight
    is [in, out]). lora_a: [r, in]; lora_b: [out, r] -> the base weight's shape."""
    delta = layer.scaling[ADAPTER] * (lora_b @ lora_a)
    return delta.T if layer.fan_in_fan_out else delta


def merged_model(model: nn.Module) -> nn.Module:
    """``model`` itself when it has no adapters; else a copy with each adapter merged into its layer's weight and
    the PEFT layers replaced by the plain ones: the architecture a generator samples and an export writes."""
    layers = adapted_layers(model)
    return _unwrapped(model, layers, merge=True) if layers else model


def frozen_base(model: nn.Module) -> nn.Module:
    """A copy of the adapted ``model`` without its adapters: the frozen base it trains on."""
    return _unwrapped(model, adapted_layers(model), merge=False)


def _unwrapped(model: nn.Module, layers: dict[str, nn.Module], merge: bool) -> nn.Module:
    """A copy of ``model`` with each of its adapted ``layers`` replaced by its base layer (merged into first)."""
    plain = copy.deepcopy(model)
    with torch.no_grad():
        for name in layers:
            layer = plain.get_submodule(name)
            base = layer.base_layer
            if merge:
                base.weight += delta_weight(layer, layer.lora_A[ADAPTER].weight, layer.lora_B[ADAPTER].weight)
            parent, _, child = name.rpartition(".")
            setattr(plain.get_submodule(parent) if parent else plain, child, base)
    if hasattr(plain, "peft_config"):
        del plain.peft_config
    return plain.requires_grad_(False)


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Every adapter of ``model`` switched off around a block: the model computes as its frozen base (the KL
    reference of a LoRA policy, no second copy of the weights anywhere)."""
    layers = adapted_layers(model).values()
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)  # PEFT marks the adapter trainable again


# ---- PEFT's on-disk format
def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors under the names PEFT writes (``base_model.model.<path>.lora_A.weight``)."""
    suffix = f".{ADAPTER}.weight"
    return {
        _PEFT_PREFIX + name.removesuffix(suffix) + ".weight": param.detach().contiguous()
        for name, param in model.named_parameters()
        if name.endswith(ADAPTER_PARAMS)
    }


def save_adapter(model: nn.Module, lora: LoraConfig, directory: str | Path, base_model: str | None) -> Path:
    """Write ``model``'s adapter in PEFT's format: ``PeftModel.from_pretrained(base, directory)`` loads it.
    base_model: recorded as ``base_model_name_or_path`` (where the base's weights are). The task type is a causal
    LM's for a causal LM, feature extraction for a critic's backbone (a base model: the head is not PEFT's)."""
    is_causal_lm = hasattr(model, "get_output_embeddings") and model.get_output_embeddings() is not None
    config = peft_config(lora, task_type="CAUSAL_LM" if is_causal_lm else "FEATURE_EXTRACTION")
    config.base_model_name_or_path = base_model
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(directory))
    save_file(adapter_state(model), str(directory / ADAPTER_WEIGHTS))
    return directory


def load_adapter(model: nn.Module, lora: LoraConfig) -> None:
    """``lora.adapter_path``'s weights into ``model``'s (fresh) adapter. Raises InputError when the directory's
    rank, alpha or target modules differ from ``lora``'s, when a tensor is missing or left over, or when the weights
    are not in safetensors (a pickled ``adapter_model.bin`` is never loaded)."""
    directory = Path(lora.adapter_path)
    config_file, weights_file = directory / ADAPTER_CONFIG, directory / ADAPTER_WEIGHTS
    if not config_file.is_file() or not weights_file.is_file():
        raise InputError(
            f"{directory}: a LoRA adapter directory holds {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS} (adapters are read "
            "from safetensors only, never unpickled)"
        )
    saved = json.loads(config_file.read_text())
    targets = saved.get("target_modules")
    targets = (targets,) if isinstance(targets, str) else tuple(sorted(targets or ()))
    wanted = ("all-linear",) if lora.target_modules == ("all-linear",) else tuple(sorted(lora.target_modules))
    mismatched = [
        f"{key} {have} (config: {want})"
        for key, have, want in [("r", saved.get("r"), lora.rank), ("lora_alpha", saved.get("lora_alpha"), lora.alpha)]
        if have is None or float(have) != float(want)
    ]
    if targets != wanted and not (wanted == ("all-linear",) and set(targets) == _target_names(model)):
        mismatched.append(f"target_modules {list(targets)} (config: {list(lora.target_modules)})")
    if mismatched:
        raise InputError(f"{directory}: the adapter has {', '.join(mismatched)}; set lora.* to match it")
    own = {name.removeprefix(_PEFT_PREFIX): name for name in adapter_state(model)}
    tensors = {name.removeprefix(_PEFT_PREFIX): t for name, t in load_file(str(weights_file)).items()}
    missing, extra = sorted(own.keys() - tensors.keys()), sorted(tensors.keys() - own.keys())
    if missing or extra:
        raise InputError(
            f"{directory}: the adapter does not fit this model: missing {missing[:3]}, not in the model {extra[:3]} "
            f"({len(missing)} missing, {len(extra)} extra)"
        )
    params = dict(model.named_parameters())
    suffix = f".{ADAPTER}.weight"
    with torch.no_grad():
        for name, tensor in tensors.items():
            params[name.removesuffix(".weight") + suffix].copy_(tensor)


def _target_names(model: nn.Module) -> set[str]:
    """The last path component of each adapted layer (what ``all-linear`` resolved to)."""
    return {name.rpartition(".")[2] for name in adapted_layers(model)}
