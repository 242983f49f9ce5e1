"""The same worker code run in one process and on gloo ranks: fresh workers through one round (inference, one PPO
update of each, the refit), and what each rank ends with."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor

from dtppo.distributed.comm import rank
from dtppo.distributed.ranks import run_ranks
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.models.weights import full_parameters
from dtppo.testing.batches import synthetic_experience
from dtppo.testing.configs import make_config
from dtppo.workers.policy import PolicyWorker
from dtppo.workers.value import ValueWorker


def worker_results(overrides: list[str], inspect: Callable[[PolicyWorker, ValueWorker], dict] | None = None) -> dict:
    """Fresh workers: inference (reference log-probs too when loss.kl.coef > 0), one PPO update of each, the refit;
    what this rank ends with, plus ``inspect(policy, value)``'s entries."""
    cfg = make_config(overrides)
    tok = build_char_tokenizer()
    policy, value = PolicyWorker(cfg, tok), ValueWorker(cfg, tok)
    initial = {"policy_initial": full_state_dict(policy.model), "value_initial": full_state_dict(value.model)}
    gradients = {
        "policy_grads": capture_first_gradients(policy.model, policy.updater.optimizer),
        "value_grads": capture_first_gradients(value.model, value.updater.optimizer),
    }
    exp = synthetic_experience(len(tok))
    values, logprobs = value.get_values(exp), policy.get_logprobs(exp)
    reference = policy.get_reference_logprobs(exp) if cfg.loss.kl.coef > 0 else None
    noise = torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(1)) * 0.1
    exp = exp.replace(old_values=values + 0.3 * noise, old_logprobs=logprobs + noise, ref_logprobs=reference)
    value_metrics, policy_metrics = value.train(exp), policy.train(exp)
    policy.finish_training()
    policy.refit(1)  # refreshes the generation replica, as the trainer's weight_refit phase does
    return {
        "values": values,
        "logprobs": logprobs,
        "ref_logprobs": reference,
        "value_metrics": value_metrics,
        "policy_metrics": policy_metrics,
        "policy_weights": full_state_dict(policy.model),
        "value_weights": full_state_dict(value.model),
        "rollout_weights": {k: v.clone() for k, v in policy.generator.model.state_dict().items()},
        # what the vLLM backend's refit streams (every name of a tied parameter)
        "streamed_weights": {name: t.clone() for name, t in full_parameters(policy.model, policy.layout.device)},
        "policy_local_numel": sum(_local(p).numel() for p in policy.model.parameters()),
        **initial,
        **gradients,
        **(inspect(policy, value) if inspect is not None else {}),
    }


def capture_first_gradients(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """A dict that ``optimizer``'s first step fills with every trained parameter's whole gradient, as the step sees
    it (after accumulation over microbatches and ranks, and after clipping): what the sharded and unsharded paths
    must agree on before Adam, whose first step ~ lr·sign(g) hides most gradient errors."""
    grads: dict[str, torch.Tensor] = {}
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]

    def capture(optimizer, args, kwargs) -> None:
        if not grads:  # every rank takes part: gathering a sharded gradient is a collective
            grads.update({name: _whole(p.grad).detach().clone() for name, p in named if p.grad is not None})

    optimizer.register_step_pre_hook(capture)
    return grads


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded tensor gathered whole (on every rank), a plain one as it is."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def worker_round(overrides: list[str], out_path: str) -> None:
    """:func:`worker_results`, saved by rank 0."""
    result = worker_results(overrides)
    if rank() == 0:
        torch.save(result, out_path)


def _local(param: torch.Tensor) -> torch.Tensor:
    """What this rank stores of a parameter: its shard when sharded."""
    return param.to_local() if isinstance(param, DTensor) else param


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's whole state dict on every rank (sharded parameters gathered), detached copies."""
    return {
        k: v.detach().clone()
        for k, v in get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)).items()
    }


def run(fn, world: int, overrides: list[str]) -> dict:
    """``fn(overrides, out_path)`` on ``world`` ranks (1 = this process); returns rank 0's saved result."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.pt")
        run_ranks(fn, world, [*overrides, f"cluster.workers_per_node={world}"], out)
        return torch.load(out, weights_only=False)
