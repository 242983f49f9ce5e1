"""parallelize(): tensor parallel (+ sequence parallel) first, then FSDP2 per decoder block and the root.

Works on HF decoder stacks laid out like Qwen2/Llama (``layers[i].self_attn.{q,k,v,o}_proj``,
``layers[i].mlp.{gate,up,down}_proj``, ``input_layernorm``, ``post_attention_layernorm``). HF attention
reshapes with ``view(..., -1, head_dim)``, so column-sharded projections simply hold the local heads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from dtppo.distributed.parallel_dims import MeshAxis, Meshes, ParallelDims

# Where decoder blocks live: Qwen2/Llama-style (causal LM, base model, ValueModel), then GPT-2-style.
_BLOCK_PATHS = ("model.layers", "backbone.layers", "layers", "transformer.h", "backbone.h", "h")


def decoder_layers(model: nn.Module) -> nn.ModuleList | None:
    """The decoder blocks of a causal LM, a base model, or a ValueModel; None for a layout not listed above."""
    for path in _BLOCK_PATHS:
        module = model
        try:
            for name in path.split("."):
                module = getattr(module, name)
        except AttributeError:
            continue
        if isinstance(module, nn.ModuleList):
            return module
    return None


def tensor_parallel_plan_fits(model: nn.Module) -> bool:
    """Whether every decoder block has each module the tensor-parallel plan shards."""
    layers = decoder_layers(model)
    names = _layer_plan(sequence_parallel=True).keys()
    return layers is not None and all(_has_submodule(layer, name) for layer in layers for name in names)


def _has_submodule(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


def _layer_plan(sequence_parallel: bool) -> dict:
    """Megatron-style plan for one block. With SP the norms run on sequence shards and the block's entry
    and exit convert between the replicated residual stream and sequence shards (SP stays inside the block,
    because HF builds masks and rotary tables for the full sequence outside it)."""
    out_layout = Shard(1) if sequence_parallel else Replicate()
    plan = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(output_layouts=out_layout, use_local_output=not sequence_parallel),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=out_layout, use_local_output=not sequence_parallel),
    }
    if sequence_parallel:
        plan |= {
            "input_layernorm": SequenceParallel(),
            "post_attention_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
            ),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        }
    return plan


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    for layer in decoder_layers(model):
        parallelize_module(layer, tp_mesh, _layer_plan(sequence_parallel))
        if sequence_parallel:
            entry_exit = {
                "": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),)),
            }
            parallelize_module(layer, tp_mesh, entry_exit)
            parallelize_module(
                layer,
                tp_mesh,
                PrepareModuleOutput(
                    output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),), use_local_output=True
                ),
            )


def compute_dtype() -> torch.dtype:
    """The dtype models compute in: bf16 on GPU (FSDP2 casts the fp32 parameters per forward, gradients reduce in
    fp32), fp32 on CPU (CPUs without bf16 matmul units run bf16 matmuls many times slower than fp32). The one
    definition: FSDP2's mixed precision and the policy's generation replica both follow it."""
    return torch.bfloat16 if torch.cuda.is_available() else torch.float32


def mixed_precision() -> MixedPrecisionPolicy:
    """FSDP2's policy for :func:`compute_dtype`: parameters cast to it for compute, gradients reduced in fp32."""
    dtype = compute_dtype()
    return (
        MixedPrecisionPolicy()
        if dtype == torch.float32
        else MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    )


def parallelize(model: nn.Module, meshes: Meshes, dims: ParallelDims, cpu_offload: bool = False) -> nn.Module:
    """In place: TP (+SP) over the ``tp`` axis, then FSDP2 over ``dp_shard`` × ``cp`` (each block, then the root),
    replicated over ``dp_replicate`` (HSDP: reduce-scatter within a replica, all-reduce across replicas).

    Parameters compute in :func:`compute_dtype` (:func:`mixed_precision`). Gradients are summed, not averaged,
    across ranks: losses are already divided by the global token count.
    cpu_offload: every FSDP unit keeps its parameter and gradient shards in host memory (FSDP2's
    ``CPUOffloadPolicy``, pinned when there is a GPU) and copies them to the device around each use; an optimizer
    built on the returned parameters then holds its state and steps there too.
    """
    if dims.tp > 1:
        apply_tp(model, meshes.root[MeshAxis.TP], dims.sequence_parallel)
    mp = mixed_precision()
    offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload else OffloadPolicy()
    dp_mesh = meshes.fsdp
    # No known blocks (warned at config load): the root alone is one FSDP unit, gathered whole per forward.
    for layer in decoder_layers(model) or ():
        fully_shard(layer, mesh=dp_mesh, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, offload_policy=offload)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM
    return model


@contextmanager
def microbatch_accumulation(model: nn.Module, unsharded: bool) -> Iterator[Callable[[bool], None]]:
    """FSDP2 communication over the microbatches of one optimizer step; yields ``before(last: bool)`` to call
    before each microbatch's forward.

    unsharded=True: parameters are gathered once and stay gathered (no reshard after forward or between
    microbatches); gradients accumulate unsharded on this rank and the last microbatch's backward
    reduce-scatters their sum, then reshards. One all-gather + one reduce-scatter per optimizer step instead
    of two all-gathers + one reduce-scatter per microbatch; the price is the whole model's parameters and
    gradients resident during the step (optimizer state stays sharded). The gradient is the same sum.
    unsharded=False, or a model that is not FSDP-wrapped: FSDP's defaults, nothing changes.
    """
    if not (unsharded and isinstance(model, FSDPModule)):
        yield lambda last: None
        return

    def before(last: bool) -> None:
        model.set_requires_gradient_sync(last)
        model.set_reshard_after_backward(last)

    model.set_reshard_after_forward(False)
    try:
        yield before
    finally:
        # FSDP's defaults again (inference forwards reshard): every block after forward, the root not.
        model.set_requires_gradient_sync(True)
        model.set_reshard_after_backward(True)
        model.set_reshard_after_forward(True)
        model.set_reshard_after_forward(False, recurse=False)
