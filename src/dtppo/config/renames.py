"""Keys that moved into their feature's subsection, and the rewrite that lets a recipe written with the old names
load: each old key found is moved to its new place and named in one line on stderr."""

from __future__ import annotations

import sys
from typing import Any

from dtppo.config.rules import ConfigError

RENAMES: dict[str, str] = {
    "ppo.val_period": "ppo.validation.period",
    "ppo.val_at_start": "ppo.validation.at_start",
    "ppo.max_val_samples": "ppo.validation.max_samples",
    "ppo.val_batch_size": "ppo.validation.batch_size",
    "policy.generation.val_greedy": "ppo.validation.greedy",
    "ppo.gamma": "ppo.gae.gamma",
    "ppo.lambda_value": "ppo.gae.lambda_value",
    "ppo.lambda_policy": "ppo.gae.lambda_policy",
    "ppo.length_adaptive_alpha": "ppo.gae.length_adaptive_alpha",
    "ppo.gae_unit": "ppo.gae.unit",
    "ppo.policy_training_start_step": "value.warmup.steps",
    "value.warmup_until_ev": "value.warmup.until_ev",
    "value.warmup_ev_window": "value.warmup.ev_window",
    "value.warmup_max_steps": "value.warmup.max_steps",
    "value.vtrace_rho_cap": "value.vtrace.rho_cap",
    "value.vtrace_c_cap": "value.vtrace.c_cap",
    "loss.kl_coef": "loss.kl.coef",
    "loss.kl_estimator": "loss.kl.estimator",
    "loss.kl_in_reward": "loss.kl.in_reward",
    "loss.rollout_is": "loss.rollout_correction.importance_sampling",
    "loss.rollout_is_cap": "loss.rollout_correction.importance_sampling_cap",
    "ppo.seq_logprob_error_threshold": "loss.rollout_correction.seq_logprob_error_threshold",
}
"""Old dotted key → new dotted key."""


def renamed_key(dotted: str) -> str:
    """The current name of ``dotted`` (itself when it was never renamed)."""
    return RENAMES.get(dotted, dotted)


def migrate(tree: dict[str, Any], notice: bool = True) -> dict[str, Any]:
    """``tree`` (a merged recipe mapping) with every old key moved to its new place, in place; one line on stderr per
    key moved when ``notice``. Setting a key under both names is an error: which one should win is not ours to say."""
    for old, new in RENAMES.items():
        *parents, leaf = old.split(".")
        section = _section(tree, parents)
        if section is None or leaf not in section:
            continue
        value = section.pop(leaf)
        *new_parents, new_leaf = new.split(".")
        target = tree
        for name in new_parents:
            child = target.setdefault(name, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{new}: {name} is not a section")
            target = child
        if new_leaf in target:
            raise ConfigError(f"{old}: renamed {new}, and the recipe sets both: keep {new}")
        target[new_leaf] = value
        if notice:
            print(f"config: {old} is now {new}; the recipe loads, but write {new}", file=sys.stderr)
    return tree


def _section(tree: dict[str, Any], path: list[str]) -> dict[str, Any] | None:
    node: Any = tree
    for name in path:
        node = node.get(name) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None
