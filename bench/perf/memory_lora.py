"""What LoRA saves: the Qwen2.5-0.5B-shaped policy, its KL reference and the critic (the same backbone with a scalar
head) as the workers hold them, at full fine-tuning (the reference a frozen copy of the policy) and with LoRA rank 16
and 64 on every linear layer of both models (the reference is then the policy with its adapters off: no copy). Per
rank at dp=1 and dp=2 (FSDP2): each model's parameters, the trainable parameters, AdamW's state after a warm-up step
on 16 tokens per rank, the RSS then (everything resident between steps) and its peak during the warm-up. Writes
bench/results/perf/memory_lora.json.

    python -m bench.perf.memory_lora [--layers 24]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from bench.common.memory import cuda, in_child, largest, qwen_config, reset_peak, status_kib, updater, write_rank_result
from bench.common.paths import PERF
from bench.common.record import kernels_prefix, write_record
from bench.common.shapes import QWEN_05B

MODES = {"full": 0, "lora-r16": 16, "lora-r64": 64}


def _local(tensor):
    """What this rank stores of a tensor: its shard when sharded."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def built(mode: str, layers: int):
    """Policy, critic and (at full fine-tuning) the frozen reference, as the workers build them for ``mode``."""
    import copy

    import torch
    from transformers import Qwen2ForCausalLM, Qwen2Model

    from dtppo.config import LoraConfig, ParallelConfig
    from dtppo.distributed.comm import world_size
    from dtppo.models.lora import add_adapters
    from dtppo.models.value import ValueModel
    from dtppo.workers.layout import RankLayout

    torch.manual_seed(0)
    config = qwen_config(layers)
    lora = LoraConfig(rank=MODES[mode], alpha=2.0 * max(1, MODES[mode]))
    policy, backbone = Qwen2ForCausalLM(config), Qwen2Model(config)
    if lora.enabled:
        add_adapters(policy, lora, seed=0)
        add_adapters(backbone, lora, seed=0)
    layout = RankLayout(ParallelConfig(), range(world_size()))
    reference = None if lora.enabled else layout.wrap(copy.deepcopy(policy).eval().requires_grad_(False))
    return {"policy": layout.wrap(policy), "critic": layout.wrap(ValueModel(backbone))}, reference, layout


def resident(mode: str, layers: int, out: str) -> None:
    """Rank entry: the models of ``mode``, one warm-up step each; MiB per rank."""
    import torch

    models, reference, layout = built(mode, layers)
    before = reset_peak()
    ids = torch.randint(0, qwen_config(layers).vocab_size, (1, 16))
    engines = {}
    for name, model in models.items():
        engines[name] = updater(model, layout)
        output = model(input_ids=ids).logits if name == "policy" else model.values(ids, torch.ones_like(ids))
        output.float().square().mean().backward()
        engines[name].optimizer_step()
    row = {f"{name}_params_MiB": _mib(m.parameters()) for name, m in models.items()}
    row["reference_params_MiB"] = _mib(reference.parameters()) if reference is not None else 0.0
    row["trainable_params"] = sum(_local(p).numel() for m in models.values() for p in m.parameters() if p.requires_grad)
    states = (t for e in engines.values() for state in e.optimizer.state.values() for t in state.values())
    row["optimizer_state_MiB"] = _mib(t for t in states if t.dim() > 0)
    row["resident_MiB"] = status_kib("VmRSS") / 1024
    row["warmup_peak_MiB"] = status_kib("VmHWM") / 1024
    row["resident_before_warmup_MiB"] = before / 1024
    on_device = layout.device.type == "cuda"  # on a GPU what matters is the device's: allocated between steps, peak
    row["device_resident_MiB"] = torch.cuda.memory_allocated() / 2**20 if on_device else None
    row["device_peak_MiB"] = torch.cuda.max_memory_allocated() / 2**20 if on_device else None
    write_rank_result(out, row)


def _mib(tensors) -> float:
    """fp32: 4 bytes each, this rank's shard of a sharded tensor."""
    return sum(_local(t).numel() for t in tensors) * 4 / 2**20


def lora_rows(
    layers: int, ranks: tuple[int, ...], command: str, timeout: Callable[[], float | None] = lambda: None
) -> list[dict]:
    """Every (ranks, mode) measurement, each in a fresh process (group) killed after ``timeout()`` seconds; per rank:
    the largest rank's figures."""
    rows = []
    for world in ranks:
        for mode in MODES:
            worst = largest(in_child(__name__, "resident", (mode, layers), world, timeout()))
            rows.append({"ranks": world, "mode": mode, **worst, "command": command})
            print(f"dp={world} {mode}: " + ", ".join(f"{k} {v:,.0f}" for k, v in worst.items() if v is not None))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=QWEN_05B["num_hidden_layers"])
    layers = parser.parse_args().layers
    command = kernels_prefix() + f"python -m bench.perf.memory_lora --layers {layers}"
    rows = lora_rows(layers, (1, 2), command)
    print(
        f"\n{'dp':>3} {'mode':<10}{'policy':>9}{'reference':>10}{'critic':>9}{'optimizer':>10}{'trainable':>13}"
        f"{'resident':>10}{'peak':>9}   (per rank, MiB; trainable: parameters on this rank)"
    )
    for r in rows:
        print(
            f"{r['ranks']:>3} {r['mode']:<10}{r['policy_params_MiB']:>9.0f}{r['reference_params_MiB']:>10.0f}"
            f"{r['critic_params_MiB']:>9.0f}{r['optimizer_state_MiB']:>10.0f}{r['trainable_params']:>13,}"
            f"{r['resident_MiB']:>10.0f}{r['warmup_peak_MiB']:>9.0f}"
        )
    meta = {
        "measured_at": time.strftime("%Y-%m-%d %H:%M"),
        "shape": QWEN_05B | {"num_hidden_layers": layers},
        "lora": "rank r, alpha 2r, all-linear (q,k,v,o,gate,up,down) on the policy and the critic's backbone",
        "precision": "bf16 params, fp32 reduce (FSDP2), CUDA" if cuda() else "fp32, CPU",
    }
    write_record(PERF / "memory_lora.json", {"meta": meta, "rows": rows}, command, indent=2)
    print(f"wrote {PERF / 'memory_lora.json'}")


if __name__ == "__main__":
    main()
