"""Long responses: what one training pass and generation cost as the sequence grows (issue 46).

``python -m bench.perf.long_responses [--lengths 1024 ... 32768] [--passes critic policy logprobs]
[--layouts padded packed] [--cp 1 2]``: at the tiny shape (Qwen2 blocks: hidden 128, 4 layers, 4 heads / 2 KV
heads, MLP 512, vocabulary 128, random weights, fp32, dtppo's attention kernel) on 2 rows, the second 3/4 as long
as the first (so the padded layout has padding and packing has a shorter sequence): one pass of

- ``critic``: ``ValueModel.values`` forward and backward (the critic's training pass);
- ``policy``: the response log-probs (every token after the first, ``models.logprobs.sequence_logprobs``)
  forward and backward (the policy's training pass);
- ``logprobs``: the same log-probs without gradients (the log-prob recompute after generation);

padded (``sequence_packing: false``) and packed, at cp = 1 (one process) and cp = 2 (two gloo ranks, the row split
as ``parallel.cp`` splits it, zigzag). Each point is a fresh process (or pair) with one thread per rank: its
peak RSS over the RSS after the model is built (per rank, the larger of the two at cp = 2), what autograd saves for
backward (``saved_mib``: the saved tensors' storages, each counted once) and the pass's seconds.
At cp = 2 each rank holds a whole model (no FSDP): the parameters are 0.8 M here; what is measured is the
activations' and attention's share. A point over ``--limit-s`` seconds is stopped and recorded as such.

``python -m bench.perf.long_responses generation [--lengths ...]``: the torch generator's static decoder sampling
2 rows of exactly T tokens (``min_new_tokens`` = ``max_new_tokens`` = T) from a 16-token prompt at the same shape:
tokens/s and peak RSS over the model's.

``--mmap-threshold BYTES`` runs each point with glibc's ``MALLOC_MMAP_THRESHOLD_`` fixed at BYTES: every
allocation above it is its own mapping, returned to the system when freed. By default glibc raises that threshold
after each large free, so later tensors of that size come from the heap, which keeps its freed memory: the peak RSS
then holds freed memory too, more of it the more tensors a pass frees and reallocates
(docs/performance.md, "Long responses").

Writes bench/results/perf/long_responses.json (``--out``): a row per point with the command that reproduces it and
the commit it ran at (rows of earlier runs stay beside a new run's).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from functools import partial

import torch

from bench.common.paths import PERF, REPO
from bench.common.record import command_line, commit, kernels_prefix, write_record

LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768]
SHAPE = dict(
    vocab_size=128, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=512,
)  # fmt: skip


def _config(length: int, shape: dict | None = None):
    from transformers import Qwen2Config

    from dtppo.models.attention import KERNEL

    config = Qwen2Config(**(shape or SHAPE), max_position_embeddings=length + 16, tie_word_embeddings=True)
    config._attn_implementation = KERNEL
    return config


def _rows(length: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, vocab, (2, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, length * 3 // 4 :] = 0
    return ids * mask, mask


def _peak_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(length: int, layout: str, what: str, shards=None, shape: dict | None = None, device: str = "cpu") -> dict:
    """One pass in this process (one rank of a cp group when ``shards``): seconds and the peak memory over the built
    model's (host RSS on CPU in fp32; on CUDA the device's allocations, the model in bf16). shape: Qwen2 config
    fields (default: the tiny shape above)."""
    from transformers import AutoModel, AutoModelForCausalLM

    from dtppo.models.logprobs import sequence_logprobs
    from dtppo.models.value import ValueModel

    torch.manual_seed(0)
    torch.set_num_threads(1)
    where = torch.device(device)
    config = _config(length, shape)
    ids, mask = (x.to(where) for x in _rows(length, config.vocab_size))
    packing = layout == "packed"
    if what == "critic":
        model = ValueModel(AutoModel.from_config(config), sequence_packing=packing, shards=shards)
    else:
        model = AutoModelForCausalLM.from_config(config)
    model = model.to(where, torch.bfloat16 if where.type == "cuda" else torch.float32)
    if where.type == "cuda":
        torch.cuda.reset_peak_memory_stats(where)
    base = _peak_mib(where)
    saved: dict[int, int] = {}  # what autograd keeps for backward: bytes per storage, each counted once
    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(partial(_count_storage, saved), lambda t: t):
        if what == "critic":
            loss = (model.values(ids, mask) * mask).sum()
        else:
            with torch.set_grad_enabled(what == "policy"):
                loss = sequence_logprobs(model, ids, mask, mask.bool(), 1.0, 128, packing, shards).sum()
    if loss.requires_grad:
        loss.backward()
    if where.type == "cuda":
        torch.cuda.synchronize(where)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_mib": _peak_mib(where) - base, "saved_mib": sum(saved.values()) / 2**20}


def _count_storage(saved: dict[int, int], tensor: torch.Tensor) -> torch.Tensor:
    storage = tensor.untyped_storage()
    saved.setdefault(storage.data_ptr(), storage.nbytes())
    return tensor


def _rank_point(length: int, layout: str, what: str, out_path: str) -> None:
    import torch.distributed as dist

    from dtppo.distributed.context import ContextShards

    shards = ContextShards(dist.get_rank(), dist.get_world_size(), dist.group.WORLD)
    result = measure(length, layout, what, shards)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result)
    if dist.get_rank() == 0:
        with open(out_path, "w") as out:
            json.dump(gathered, out)


def point(length: int, layout: str, cp: int, what: str) -> dict:
    """One measurement in this (fresh) process."""
    if cp == 1:
        return measure(length, layout, what)
    from dtppo.distributed.ranks import run_ranks

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ranks.json")
        run_ranks(_rank_point, cp, length, layout, what, out)
        ranks = json.loads(open(out).read())
    return {key: max(r[key] for r in ranks) for key in ("seconds", "peak_mib", "saved_mib")}


def generation(length: int) -> dict:
    """Two rows of exactly ``length`` sampled tokens: tokens/s, and peak RSS over the built model."""
    from transformers import AutoModelForCausalLM

    from dtppo.generation.generator import TorchGenerator
    from dtppo.types import SampleRequest, SamplingParams

    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = _config(length + 16)
    model = AutoModelForCausalLM.from_config(config).eval()
    generator = TorchGenerator(model, (1,), 0, "static")
    prompts = [list(range(2, 18)), list(range(20, 36))]
    request = SampleRequest(prompts, SamplingParams(length, min_new_tokens=length), 0, torch.arange(2))
    base = _peak_mib(torch.device("cpu"))
    start = time.perf_counter()
    rows = generator.sample(request)
    seconds = time.perf_counter() - start
    tokens = int(rows.response_mask.sum())
    peak = _peak_mib(torch.device("cpu")) - base
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds, "peak_mib": peak}


def _child(argv: list[str], limit_s: float, mmap_threshold: int | None = None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO}:{REPO / 'src'}")
    if mmap_threshold is not None:
        env["MALLOC_MMAP_THRESHOLD_"] = str(mmap_threshold)
    command = [sys.executable, "-m", "bench.perf.long_responses", *argv]
    try:
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=limit_s)
    except subprocess.TimeoutExpired:
        return {"stopped_after_s": limit_s}
    if proc.returncode != 0:
        return {"failed": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _table(rows: list[dict]) -> None:
    print(f"{'what':9} {'layout':7} {'cp':>2} {'T':>6} {'seconds':>8} {'peak MiB':>9} {'saved MiB':>9}  x mem/doubling")
    previous: dict[tuple, dict] = {}
    for row in rows:
        key = (row["what"], row["layout"], row["cp"])
        ratio = ""
        if key in previous and "peak_mib" in row and "peak_mib" in previous[key]:
            ratio = f"{row['peak_mib'] / max(previous[key]['peak_mib'], 1e-9):.2f}"
        if "peak_mib" in row:
            saved = f"{row['saved_mib']:9.0f}" if "saved_mib" in row else f"{'-':>9}"
            cells = f"{row['seconds']:8.2f} {row['peak_mib']:9.0f} {saved}"
        else:  # stopped or failed
            cells = f"{str(row)[-30:]:>28}"
        print(f"{row['what']:9} {row['layout']:7} {row['cp']:>2} {row['T']:>6} {cells}  {ratio}", flush=True)
        previous[key] = row


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "point":
        length, layout, cp, what = int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
        print(json.dumps(point(length, layout, cp, what)))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "generate":
        print(json.dumps(generation(int(sys.argv[2]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", default="train", choices=["train", "generation"])
    parser.add_argument("--lengths", type=int, nargs="+", default=LENGTHS)
    parser.add_argument("--passes", nargs="+", default=["critic", "policy", "logprobs"])
    parser.add_argument("--layouts", nargs="+", default=["padded", "packed"])
    parser.add_argument("--cp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--limit-s", type=float, default=900.0)
    parser.add_argument("--mmap-threshold", type=int, default=None, help="glibc's, fixed (bytes); default: glibc's own")
    parser.add_argument("--out", default=str(PERF / "long_responses.json"))
    args = parser.parse_args()
    path = REPO / args.out if not os.path.isabs(args.out) else args.out
    results = json.loads(open(path).read()) if os.path.exists(path) else {"train": [], "generation": []}
    results["machine"] = {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    # Points of earlier runs stay beside this run's: each row names the commit it ran at, not only the record's.
    kernels, head, command = kernels_prefix(), commit(), command_line()
    if args.mode == "generation":
        for length in args.lengths:
            row = {"T": length, **_child(["generate", str(length)], args.limit_s)}
            row["command"] = f"{kernels}python -m bench.perf.long_responses generation --lengths {length}"
            row["commit"] = head
            print(json.dumps(row), flush=True)
            results["generation"] = _merged(results["generation"], [row], ("T",))
            write_record(path, results, command)  # after every point: an interrupted run keeps what it measured
        return
    for what in args.passes:
        for layout in args.layouts:
            for cp in args.cp:
                for length in args.lengths:
                    row = {"what": what, "layout": layout, "cp": cp, "T": length}
                    row |= _child(["point", str(length), layout, str(cp), what], args.limit_s, args.mmap_threshold)
                    threshold = "" if args.mmap_threshold is None else f" --mmap-threshold {args.mmap_threshold}"
                    row["mmap_threshold"], row["commit"] = args.mmap_threshold, head
                    row["command"] = (
                        f"{kernels}python -m bench.perf.long_responses --passes {what} --layouts {layout} "
                        f"--cp {cp} --lengths {length}{threshold}"
                    )
                    _table([row])
                    key = ("what", "layout", "cp", "T", "mmap_threshold")
                    results["train"] = _merged(results["train"], [row], key)
                    write_record(path, results, command)
    _table(results["train"])


def _merged(old: list[dict], new: list[dict], key: tuple[str, ...]) -> list[dict]:
    """``old`` rows with those ``new`` measures again replaced, in a stable order."""
    fresh = {tuple(row.get(k) for k in key): row for row in new}
    kept = [row for row in old if tuple(row.get(k) for k in key) not in fresh]
    return sorted(kept + list(fresh.values()), key=lambda row: tuple(str(row.get(k)).zfill(8) for k in key))


if __name__ == "__main__":
    main()
