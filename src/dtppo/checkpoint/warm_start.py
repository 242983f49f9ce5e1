"""``value.warm_start``: a critic's weights from an earlier run, a dtppo checkpoint or an exported critic (weights
only: the optimizer and the schedule start fresh, as NeMo-RL's ``warm_start_value_checkpoint`` does)."""

from __future__ import annotations

from pathlib import Path

import torch

from dtppo.checkpoint.export import checkpoint_models, merged_copy
from dtppo.errors import InputError
from dtppo.models.critic_format import is_exported_critic
from dtppo.models.value import ValueModel

KEY = "value.warm_start"


def load_warm_start(critic: ValueModel, path: str) -> None:
    """Load the critic at ``path`` into ``critic`` (unwrapped, without adapters), in place. The source's state must
    have ``critic``'s names and shapes: another architecture or vocabulary is refused with one line."""
    source = _exported_critic(Path(path)) if is_exported_critic(Path(path)) else _checkpoint_critic(path)
    mismatch = _mismatch(critic.state_dict(), source)
    if mismatch is not None:
        raise InputError(f"{KEY}: {path} holds a critic of another architecture or vocabulary ({mismatch})")
    critic.load_state_dict(source)


def _exported_critic(path: Path) -> dict[str, torch.Tensor]:
    """``dtppo export``'s ``critic`` directory (either layout: ``models.critic_format``), read from safetensors only."""
    if not any(path.glob("*.safetensors")):
        raise InputError(f"{KEY}: {path} has no *.safetensors (a critic's weights are read from safetensors only)")
    return ValueModel.from_pretrained(path).state_dict()


def _checkpoint_critic(path: str) -> dict[str, torch.Tensor]:
    """The critic of a dtppo checkpoint (any layout wrote it), its adapters merged."""
    if not Path(path).exists():
        raise InputError(f"{KEY}: {path}: no such checkpoint or critic directory")
    cfg, _, models = checkpoint_models(path, local=True)
    if "value" not in models:
        raise InputError(
            f"{KEY}: {path} is a checkpoint of a run without a critic "
            f"(ppo.advantage_estimator={cfg.ppo.advantage_estimator})"
        )
    return merged_copy(models["value"]).state_dict()


def _mismatch(target: dict[str, torch.Tensor], source: dict[str, torch.Tensor]) -> str | None:
    """What first differs between two critics' states (the vocabulary named as such), or None."""
    for name, tensor in target.items():
        if name.endswith("embed_tokens.weight") and name in source and source[name].shape[0] != tensor.shape[0]:
            return f"a vocabulary of {source[name].shape[0]} tokens, this critic's has {tensor.shape[0]}"
    missing, extra = sorted(set(target) - set(source)), sorted(set(source) - set(target))
    if missing or extra:
        first = f"{missing[0]} missing" if missing else f"{extra[0]} unexpected"
        return f"{len(missing)} tensor(s) missing and {len(extra)} unexpected, e.g. {first}"
    for name, tensor in target.items():
        if source[name].shape != tensor.shape:
            return f"{name} is {list(source[name].shape)}, this critic's is {list(tensor.shape)}"
    return None
