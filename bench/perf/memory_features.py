"""What activation checkpointing and CPU offload save: one training step of the Qwen2.5-0.5B-shaped policy (chunked
head) and critic on one micro-batch of 4 rows x 512 tokens, after a 16-token warm-up step (so that AdamW's state
exists), each feature off and on, at 1 process and per rank at dp=2 (offload only there on a CPU: a single CPU process
is not FSDP-wrapped and the flag does nothing). Per rank: the RSS before the step (parameters, AdamW state, the import
floor), the RSS still held after the forward (what backward needs: what checkpointing removes), the peaks of forward
+ backward and of the optimizer step over the RSS each started from, and their seconds; on CUDA the device's
allocations too (bench/device/gpu.sh records these rows on a GPU). Writes bench/results/perf/memory_features.json.

    python -m bench.perf.memory_features [--layers 6] [--out FILE]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from bench.common.memory import CHUNK, Probe, cuda, in_child, largest, qwen_config, updater, write_rank_result
from bench.common.paths import PERF
from bench.common.record import kernels_prefix, write_record
from bench.common.shapes import QWEN_05B

FEATURES = ("off", "activation_checkpointing", "cpu_offload")


def batch(vocab: int, rows: int, prompt: int, response: int):
    """Random rows of ``prompt`` + ``response`` tokens whose advantages and returns are the same noise."""
    import torch

    from dtppo.types import Experience

    ids = torch.randint(0, vocab, (rows, prompt + response))
    mask = torch.zeros(ids.shape)
    mask[:, prompt:] = 1.0
    targets = torch.randn(ids.shape) * mask
    return Experience(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        response_mask=mask,
        gen_logprobs=torch.zeros(ids.shape),
        truncated=torch.zeros(rows, dtype=torch.bool),
        advantages=targets,
        returns=targets,
    )


def loss_of(role: str, model):
    """The policy's advantage-weighted log-probs or the critic's squared error, summed: a micro-batch's loss."""
    from dtppo.models.logprobs import token_logprobs
    from dtppo.ops import masked_sum

    def loss(micro):
        if role == "policy":
            mask = micro.response_mask
            logprobs = token_logprobs(model, micro.input_ids, micro.attention_mask, mask.bool(), 1.0, CHUNK)
            return -masked_sum(logprobs * micro.advantages, mask), {}
        values = model.values(micro.input_ids, micro.attention_mask)
        return masked_sum((values - micro.returns) ** 2, micro.response_mask), {}

    return loss


def step(role: str, feature: str, layers: int, out: str) -> None:
    """Rank entry: one training step of ``role`` with ``feature`` on, phase by phase as the updater runs one
    micro-batch: MiB resident before it, held after the forward, each phase's peak over its start, and seconds."""
    import torch
    from transformers import Qwen2ForCausalLM, Qwen2Model

    from dtppo.config import ParallelConfig
    from dtppo.distributed.comm import world_size
    from dtppo.models.value import ValueModel
    from dtppo.workers.layout import RankLayout

    torch.manual_seed(0)
    config = qwen_config(layers)
    model = Qwen2ForCausalLM(config) if role == "policy" else ValueModel(Qwen2Model(config))
    layout = RankLayout(ParallelConfig(), range(world_size()))
    checkpointing, offload = feature == "activation_checkpointing", feature == "cpu_offload"
    model = layout.wrap(model, activation_checkpointing=checkpointing, cpu_offload=offload)
    engine, loss = updater(model, layout), loss_of(role, model)
    # the warm-up only has to create AdamW's state: a row of 16 tokens per rank does that at a fraction of the cost
    engine.train(batch(config.vocab_size, world_size(), 8, 8), loss, global_batch=world_size(), micro_batch=1)
    exp = batch(config.vocab_size, 4, 256, 256)  # the micro-batch: each of the dp ranks trains 4 / dp of its rows
    micro = exp.shard(layout.dp_rank, layout.dp_size).to(layout.device)
    model.train()
    probe = Probe(layout.device)
    loss_sum, _ = loss(micro)
    held = probe.added("held_after_forward")
    (loss_sum / exp.response_mask.sum()).backward()
    forward_backward = probe.phase("fwd_bwd")
    engine.optimizer_step(loss_sum.detach())
    write_rank_result(out, probe.at_start | held | forward_backward | probe.phase("optimizer"))


def features_rows(
    layers: int, ranks: tuple[int, ...], command: str, timeout: Callable[[], float | None] = lambda: None
) -> list[dict]:
    """Every (ranks, role, feature) measurement, each in a fresh process (group) killed after ``timeout()`` seconds;
    per rank: the largest rank's memory and the slowest rank's seconds. Offload only where the model is FSDP-wrapped
    (dp > 1, or any GPU run)."""
    rows = []
    for world in ranks:
        for role in ("policy", "critic"):
            for feature in FEATURES:
                if feature == "cpu_offload" and world == 1 and not cuda():
                    continue
                worst = largest(in_child(__name__, "step", (role, feature, layers), world, timeout()))
                rows.append({"ranks": world, "role": role, "feature": feature, **worst, "command": command})
                shown = ", ".join(f"{k} {v:.1f}" for k, v in worst.items() if v is not None)
                print(f"dp={world} {role} {feature}: {shown}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=6, help="blocks of the 0.5B shape (24: its full depth)")
    parser.add_argument("--out", type=Path, default=PERF / "memory_features.json")
    args = parser.parse_args()
    command = kernels_prefix() + f"python -m bench.perf.memory_features --layers {args.layers}"
    rows = features_rows(args.layers, (1, 2), command)
    print(
        f"\n{'dp':>3} {'role':<7}{'feature':<26}{'resident':>9}{'held':>7}{'fwd+bwd':>9}{'optim':>7}"
        f"{'fwd+bwd s':>11}{'optim s':>9}   (per rank; MiB: resident before the step, held after the forward,"
        " each phase's peak over its start)"
    )
    for r in rows:
        print(
            f"{r['ranks']:>3} {r['role']:<7}{r['feature']:<26}{r['resident_MiB']:>9.0f}"
            f"{r['held_after_forward_MiB']:>7.0f}{r['fwd_bwd_peak_added_MiB']:>9.0f}"
            f"{r['optimizer_peak_added_MiB']:>7.0f}{r['fwd_bwd_s']:>11.1f}{r['optimizer_s']:>9.1f}"
        )
    meta = {
        "measured_at": time.strftime("%Y-%m-%d %H:%M"),
        "shape": QWEN_05B | {"num_hidden_layers": args.layers},
        "batch": "one micro-batch of 4 rows x 512 tokens (256 prompt + 256 response), split over the dp ranks",
        "precision": "bf16 params, fp32 reduce (FSDP2), CUDA" if cuda() else "fp32, CPU",
        "chunk_size": CHUNK,
    }
    write_record(args.out, {"meta": meta, "rows": rows}, command, indent=2)


if __name__ == "__main__":
    main()
