"""Peak resident memory (max RSS), two benchmarks. Each prints a table and writes JSON, each row with its command.

``python bench/memory.py``: `dtppo ppo` on the tiny CPU recipe for one PPO step, in one process and on 2 local
ranks, next to the floor of a process that only imports the stack. Each row is a fresh child process; its peak
comes from getrusage(RUSAGE_CHILDREN) (the largest single process among the children, not a sum). The
20M-parameter training step's peak RSS is in bench/train_flops.py. Writes bench/results/memory.json.

``python bench/memory.py vocab [--layers 24]``: what the vocabulary costs. A Qwen2.5-0.5B-shaped policy (151,936
tokens, tied embedding, random weights, fp32) on 4 rows of 512 tokens (256 prompt + 256 response): the peak
memory of the log-prob recompute (no grad) and of one training micro-batch (forward + backward of the response
log-probs), for today's full logits (``logprobs_from_logits(model(...).logits / T)``, what dtppo did before
``models.logprobs``) and the chunked head (``token_logprobs``, 128 tokens a chunk), at 1 process and per rank
at dp=2 (FSDP2, gloo), and the critic (the same backbone with a scalar head) for reference. The vocabulary's share
("extra") is each variant's peak minus the floor: the same pass without logits, plus in training the gradient of
the head's weight that training any LM head needs (tied, it meets the embedding's: two [V, H] buffers at once;
"body" is the pass without it). Each measurement is a fresh process (Linux): its peak RSS is reset
once the model is built, and the pass adds its peak minus the RSS before it. Writes
bench/results/memory_vocab.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DTPPO = [sys.executable, "-m", "dtppo"]
IMPORTS = "import torch, transformers, dtppo.cli, dtppo.trainer"


def ppo_step(tmp: str, ranks: int) -> list[str]:
    """One PPO step of the demo recipe from a fresh (not SFT-initialised) tiny model, validation included;
    with 2 ranks each trains half of the recipe's 32-sample minibatch in one microbatch."""
    micro = [f"{w}.train_micro_batch_size={32 // ranks}" for w in ("policy", "value")]
    return [*DTPPO, "ppo", "recipes/tiny-math-cpu.yaml", "ppo.max_num_steps=1", "ppo.init_from_sft=false",
            f"cluster.workers_per_node={ranks}", *micro, f"logger.log_dir={tmp}/log", "logger.progress=false",
            f"checkpointing.checkpoint_dir={tmp}/ckpt"]


def peak_rss_mib(cmd: list[str]) -> tuple[float, float]:
    """Run ``cmd`` in a child with a fresh rusage account; returns (peak RSS MiB, wall s)."""
    probe = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
             "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", probe, *cmd], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    rss, wall = out.stdout.split()[-2:]
    return float(rss), float(wall)


QWEN_05B = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
            "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True}
VARIANTS = ("body", "floor", "full", "chunked", "critic")
CHUNK = 128  # policy.logprob_chunk_size's default


def vocab_pass(variant: str, phase: str, layers: int) -> float:
    """MiB that one ``phase`` ("recompute" | "train") of ``variant`` adds to this process's peak RSS."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from dtppo.config import ParallelConfig
    from dtppo.distributed.comm import is_distributed, world_size
    from dtppo.models.logprobs import token_logprobs
    from dtppo.ops import logprobs_from_logits, masked_sum
    from dtppo.workers.layout import RankLayout

    torch.manual_seed(0)
    config = Qwen2Config(**(QWEN_05B | {"num_hidden_layers": layers}), max_position_embeddings=4096)
    config._attn_implementation = "sdpa"
    model = Qwen2ForCausalLM(config)
    if is_distributed() and variant != "critic":
        model = RankLayout(ParallelConfig(), range(world_size())).wrap(model)
    rows, prompt, response = 4 // world_size(), 256, 256
    ids = torch.randint(0, config.vocab_size, (rows, prompt + response))
    attention = torch.ones_like(ids)
    mask = torch.zeros(ids.shape, dtype=torch.bool)
    mask[:, prompt:] = True
    temperature = 1.0

    if variant == "critic":  # the same backbone with a scalar head: no vocabulary-sized output at all
        from dtppo.models.value import ValueModel

        critic = ValueModel(model.model)
        if is_distributed():
            critic = RankLayout(ParallelConfig(), range(world_size())).wrap(critic)

    def compute() -> torch.Tensor:
        if variant == "critic":
            return masked_sum(critic.values(ids, attention), mask)
        if variant in ("body", "floor"):  # the forward with no logits (as token_logprobs runs it)
            caught = []
            head = model.get_output_embeddings()
            hooks = [model.base_model.register_forward_hook(lambda m, a, out: caught.append(out.last_hidden_state)),
                     head.register_forward_hook(lambda m, a, out: caught.append(m.weight))]
            model(input_ids=ids, attention_mask=attention, logits_to_keep=torch.zeros(0, dtype=torch.long))
            for hook in hooks:
                hook.remove()
            # floor: plus a gradient for the head's weight, which training any LM head needs (tied: it meets the
            # embedding's gradient, two [V, H] buffers at once)
            return caught[0].square().mean() + (0.0 * caught[1].sum() if variant == "floor" else 0.0)
        if variant == "full":  # before models.logprobs: every position's logits, a tempered copy, log_softmax
            logits = model(input_ids=ids, attention_mask=attention).logits
            return masked_sum(logprobs_from_logits(logits / temperature, ids), mask)
        return masked_sum(token_logprobs(model, ids, attention, mask, temperature, CHUNK), mask)

    before = _reset_peak()
    if phase == "recompute":
        with torch.no_grad():
            compute()
    else:
        compute().backward()
    return (_status_kib("VmHWM") - before) / 1024


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        return int(next(line.split()[1] for line in fh if line.startswith(field + ":")))


def _reset_peak() -> int:
    """Linux: reset this process's peak RSS to its current RSS (clear_refs 5); returns that RSS in KiB. The
    model's build (a whole model before FSDP shards it) must not count as the pass's peak."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    return _status_kib("VmRSS")


def _vocab_rank(variant: str, phase: str, layers: int, out: str) -> None:
    from dtppo.distributed.comm import rank

    added = vocab_pass(variant, phase, layers)
    Path(f"{out}.{rank()}").write_text(str(added))


def vocab_child(variant: str, phase: str, layers: int, ranks: int) -> float:
    """The largest rank's added MiB, measured in a fresh process (or process group)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/added"
        code = ("import sys; sys.path.insert(0, 'bench'); import memory; "
                "from dtppo.distributed.launch import run_ranks; "
                f"run_ranks(memory._vocab_rank, {ranks}, {variant!r}, {phase!r}, {layers}, {out!r})" if ranks > 1 else
                "import sys; sys.path.insert(0, 'bench'); import memory; "
                f"memory._vocab_rank({variant!r}, {phase!r}, {layers}, {out!r})")
        env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // ranks)))
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"{variant} {phase} x{ranks} failed:\n{proc.stderr[-3000:]}")
        return max(float(Path(f"{out}.{r}").read_text()) for r in range(ranks))


def main_vocab(layers: int) -> None:
    command = f"python bench/memory.py vocab --layers {layers}"
    rows = []
    for ranks in (1, 2):
        for phase in ("recompute", "train"):
            added = {v: vocab_child(v, phase, layers, ranks) for v in VARIANTS}
            floor = added["floor"]  # = body when no gradient is computed
            full_extra, chunked_extra = added["full"] - floor, added["chunked"] - floor
            rows.append({"ranks": ranks, "phase": phase, **{f"{v}_added_MiB": added[v] for v in VARIANTS},
                         "full_vocab_extra_MiB": full_extra, "chunked_vocab_extra_MiB": chunked_extra,
                         "chunked_over_full": chunked_extra / full_extra if full_extra > 0 else None,
                         "command": command})
            print(f"dp={ranks} {phase}: " + ", ".join(f"{v} +{added[v]:.0f} MiB" for v in VARIANTS), flush=True)
    print(f"\n{'dp':>3} {'phase':<10}{'body':>8}{'floor':>8}{'full':>8}{'chunked':>9}{'critic':>8}"
          f"{'extra: full':>13}{'chunked':>9}{'ratio':>7}   (MiB added to the peak, per rank)")
    for r in rows:
        ratio = "n/a" if r["chunked_over_full"] is None else f"{r['chunked_over_full']:.3f}"
        print(f"{r['ranks']:>3} {r['phase']:<10}{r['body_added_MiB']:>8.0f}{r['floor_added_MiB']:>8.0f}"
              f"{r['full_added_MiB']:>8.0f}{r['chunked_added_MiB']:>9.0f}{r['critic_added_MiB']:>8.0f}"
              f"{r['full_vocab_extra_MiB']:>13.0f}{r['chunked_vocab_extra_MiB']:>9.0f}{ratio:>7}")
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    meta = {"measured_at": time.strftime("%Y-%m-%d %H:%M"), "shape": QWEN_05B | {"num_hidden_layers": layers},
            "batch": "4 rows x 512 tokens (256 prompt + 256 response), fp32, CPU", "chunk_size": CHUNK}
    (out / "memory_vocab.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", nargs="?", choices=["ppo", "vocab"], default="ppo")
    parser.add_argument("--layers", type=int, default=QWEN_05B["num_hidden_layers"])
    args = parser.parse_args()
    if args.what == "vocab":
        main_vocab(args.layers)
    else:
        main_ppo()


def main_ppo() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = [
            ("import floor (torch + transformers + dtppo)", [sys.executable, "-c", IMPORTS]),
            ("tiny-math-cpu PPO, 1 step, 1 process", ppo_step(f"{tmp}/a", 1)),
            ("tiny-math-cpu PPO, 1 step, 2 ranks (largest)", ppo_step(f"{tmp}/b", 2)),
        ]
        for name, cmd in cases:
            rss, wall = peak_rss_mib(cmd)
            shown = " ".join(cmd).replace(sys.executable, "python").replace(tmp, "$TMP")
            rows.append({"case": name, "peak_rss_MiB": rss, "wall_s": wall, "run": shown,
                         "command": "python bench/memory.py"})
    print(f"{'case':<48}{'peak RSS MiB':>14}{'wall s':>9}")
    for r in rows:
        print(f"{r['case']:<48}{r['peak_rss_MiB']:>14.0f}{r['wall_s']:>9.1f}")
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "memory.json").write_text(json.dumps({"measured_at": time.strftime("%Y-%m-%d %H:%M"), "rows": rows},
                                                indent=2))


if __name__ == "__main__":
    main()
