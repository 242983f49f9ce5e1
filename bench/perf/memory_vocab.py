"""What the vocabulary costs in memory: a Qwen2.5-0.5B-shaped policy (151,936 tokens, tied embedding, random weights,
fp32) on 4 rows of 256 + 256 tokens, the peak of the log-prob recompute (no grad) and of one training micro-batch, per
rank at dp=1 and dp=2 (FSDP2, gloo), each in a fresh process whose peak is reset once the model is built. Variants:
``full`` logits (a tempered copy, log_softmax), the ``chunked`` head (``models.logprobs.token_logprobs``), the
``critic`` (a scalar head), the ``body`` without logits and the ``floor``: the body plus the head weight's gradient
that training any LM head needs (tied: two [V, H] buffers at once). A variant's vocabulary share is its peak minus the
floor. Writes bench/results/perf/memory_vocab.json.

    python -m bench.perf.memory_vocab [--layers 6]
"""

from __future__ import annotations

import argparse
import time

from bench.common.memory import CHUNK, in_child, qwen_config, reset_peak, status_kib, write_rank_result
from bench.common.paths import PERF
from bench.common.record import kernels_prefix, write_record
from bench.common.shapes import QWEN_05B

VARIANTS = ("body", "floor", "full", "chunked", "critic")


def build(variant: str, layers: int):
    """The model ``variant`` runs, wrapped for the ranks, and a batch: (model, ids, attention, response mask)."""
    import torch
    from transformers import Qwen2ForCausalLM

    from dtppo.config import ParallelConfig
    from dtppo.distributed.comm import is_distributed, world_size
    from dtppo.models.value import ValueModel
    from dtppo.workers.layout import RankLayout

    torch.manual_seed(0)
    config = qwen_config(layers)
    model = Qwen2ForCausalLM(config)
    if variant == "critic":  # the same backbone with a scalar head: no vocabulary-sized output at all
        model = ValueModel(model.model)
    if is_distributed():
        model = RankLayout(ParallelConfig(), range(world_size())).wrap(model)
    ids = torch.randint(0, config.vocab_size, (4 // world_size(), 512))
    mask = torch.zeros(ids.shape, dtype=torch.bool)
    mask[:, 256:] = True
    return model, ids, torch.ones_like(ids), mask


def loss(variant: str, model, ids, attention, mask):
    """The pass ``variant`` measures, summed over the response tokens."""
    import torch

    from dtppo.models.logprobs import token_logprobs
    from dtppo.ops import logprobs_from_logits, masked_sum

    if variant == "critic":
        return masked_sum(model.values(ids, attention), mask)
    if variant == "full":  # every position's logits, a tempered copy (T = 1), log_softmax
        return masked_sum(logprobs_from_logits(model(input_ids=ids, attention_mask=attention).logits / 1.0, ids), mask)
    if variant == "chunked":
        return masked_sum(token_logprobs(model, ids, attention, mask, 1.0, CHUNK), mask)
    caught = []  # body, floor: the forward with no logits, as token_logprobs runs it
    head = model.get_output_embeddings()
    hooks = [
        model.base_model.register_forward_hook(lambda m, a, out: caught.append(out.last_hidden_state)),
        head.register_forward_hook(lambda m, a, out: caught.append(m.weight)),
    ]
    model(input_ids=ids, attention_mask=attention, logits_to_keep=torch.zeros(0, dtype=torch.long))
    for hook in hooks:
        hook.remove()
    return caught[0].square().mean() + (0.0 * caught[1].sum() if variant == "floor" else 0.0)


def added_mib(variant: str, phase: str, layers: int, out: str) -> None:
    """Rank entry: MiB that one ``phase`` ("recompute" | "train") of ``variant`` adds to this process's peak."""
    import torch

    model, ids, attention, mask = build(variant, layers)
    before = reset_peak()
    if phase == "recompute":
        with torch.no_grad():
            loss(variant, model, ids, attention, mask)
    else:
        loss(variant, model, ids, attention, mask).backward()
    write_rank_result(out, (status_kib("VmHWM") - before) / 1024)


def rows(layers: int, command: str) -> list[dict]:
    out = []
    for ranks in (1, 2):
        for phase in ("recompute", "train"):
            added = {v: max(in_child(__name__, "added_mib", (v, phase, layers), ranks)) for v in VARIANTS}
            full, chunked = added["full"] - added["floor"], added["chunked"] - added["floor"]
            out.append(
                {
                    "ranks": ranks,
                    "phase": phase,
                    **{f"{v}_added_MiB": added[v] for v in VARIANTS},
                    "full_vocab_extra_MiB": full,
                    "chunked_vocab_extra_MiB": chunked,
                    "chunked_over_full": chunked / full if full > 0 else None,
                    "command": command,
                }
            )
            print(f"dp={ranks} {phase}: " + ", ".join(f"{v} +{added[v]:.0f} MiB" for v in VARIANTS), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=6, help="blocks of the 0.5B shape (24: its full depth)")
    layers = parser.parse_args().layers
    command = kernels_prefix() + f"python -m bench.perf.memory_vocab --layers {layers}"
    measured = rows(layers, command)
    print(
        f"\n{'dp':>3} {'phase':<10}{'body':>8}{'floor':>8}{'full':>8}{'chunked':>9}{'critic':>8}"
        f"{'extra: full':>13}{'chunked':>9}{'ratio':>7}   (MiB added to the peak, per rank)"
    )
    for r in measured:
        ratio = "n/a" if r["chunked_over_full"] is None else f"{r['chunked_over_full']:.3f}"
        added = "".join(f"{r[f'{v}_added_MiB']:>{9 if v == 'chunked' else 8}.0f}" for v in VARIANTS)
        extra = f"{r['full_vocab_extra_MiB']:>13.0f}{r['chunked_vocab_extra_MiB']:>9.0f}"
        print(f"{r['ranks']:>3} {r['phase']:<10}{added}{extra}{ratio:>7}")
    meta = {
        "measured_at": time.strftime("%Y-%m-%d %H:%M"),
        "shape": QWEN_05B | {"num_hidden_layers": layers},
        "batch": "4 rows x 512 tokens (256 prompt + 256 response), fp32, CPU",
        "chunk_size": CHUNK,
    }
    write_record(PERF / "memory_vocab.json", {"meta": meta, "rows": measured}, command, indent=2)


if __name__ == "__main__":
    main()
