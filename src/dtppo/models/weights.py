"""A trained model's weights as a generator loads them: whole tensors under the plain HF names, adapters merged.

Every refit goes through here (the torch generator's replica, the vLLM engine, the generation ranks), so what the
generator samples is exactly what the trainer computes with, whether the policy trains full weights or LoRA.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from dtppo.models.lora import ADAPTER_PARAMS, adapted_layers, delta_weight


def plain_name(name: str) -> str | None:
    """A parameter's name in the model without adapters (``q_proj.base_layer.weight`` -> ``q_proj.weight``); None
    for an adapter's own tensors, which merge into their layer's weight."""
    if name.endswith(ADAPTER_PARAMS):
        return None
    return name.replace(".base_layer.", ".")


def weight_names(model: nn.Module) -> list[str]:
    """The plain names of ``model``'s parameters, each tied parameter once, in order: both ends of a weight
    message build the same list (the trainer from its adapted model, a generation rank from the plain one)."""
    names = (plain_name(name) for name, _ in model.named_parameters())
    return [name for name in names if name is not None]


def full_parameters(model: nn.Module, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """(plain HF name, whole tensor) per parameter of ``model`` (sharded or not, adapted or not), gathered lazily:
    collective, every rank of the model iterates. An adapted layer's weight comes merged, W + (alpha / r)·B·A, once
    its adapter's two tensors are gathered (they follow the weight in ``named_parameters``), so the extra memory
    stays near one layer. Tied parameters come under each of their names: vLLM's CPU build keeps a separate
    (repacked) copy of a tied lm_head, which would otherwise keep its old weights."""
    layers = adapted_layers(model)
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        data = param.detach()
        # Offloaded shards live in host memory: gathered on the device, as FSDP2's own all-gathers are.
        whole = data.to(device).full_tensor() if isinstance(data, DTensor) else data
        owner, part = _adapter_part(name, layers)
        if owner is None:
            yield plain_name(name), whole
            continue
        parts = pending.setdefault(owner, {})
        parts[part] = whole
        if len(parts) == 3:
            del pending[owner]
            yield f"{owner}.weight", parts["weight"] + delta_weight(layers[owner], parts["lora_A"], parts["lora_B"])
    assert not pending, f"adapted layers left unmerged: {sorted(pending)}"


def _adapter_part(name: str, layers: dict[str, nn.Module]) -> tuple[str | None, str]:
    """(adapted layer, which of its weight / lora_A / lora_B) for a parameter that merges; (None, "") otherwise
    (a plain parameter, or an adapted layer's bias, which passes through unchanged)."""
    for part, suffix in (
        ("weight", ".base_layer.weight"),
        ("lora_A", ADAPTER_PARAMS[0]),
        ("lora_B", ADAPTER_PARAMS[1]),
    ):
        if name.endswith(suffix) and name.removesuffix(suffix) in layers:
            return name.removesuffix(suffix), part
    return None, ""


def load_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy ``weights`` (plain name, whole tensor; :func:`full_parameters`) into the plain model ``model`` in place,
    cast to its parameters' dtype. Raises ValueError for a name it lacks or a parameter left without weights."""
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded = set()
    with torch.no_grad():
        for name, tensor in weights:
            if name not in params:
                raise ValueError(f"weights for {name}, which the generator's model does not have")
            params[name].copy_(tensor)
            loaded.add(name)
    missing = params.keys() - loaded
    if missing:
        raise ValueError(f"no weights for {len(missing)} parameters of the generator's model: {sorted(missing)[:3]}")
