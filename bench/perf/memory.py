"""Peak resident memory (max RSS), two benchmarks. Each prints a table and writes JSON, each row with its command.

``python -m bench.perf.memory``: `dtppo ppo` on the tiny CPU recipe for one PPO step, in one process and on 2 local
ranks, next to the floor of a process that only imports the stack. Each row is a fresh child process; its peak
comes from getrusage(RUSAGE_CHILDREN) (the largest single process among the children, not a sum). The
20M-parameter training step's peak RSS is in bench/perf/train_flops.py. Writes bench/results/perf/memory.json.

``python -m bench.perf.memory vocab [--layers 24]``: what the vocabulary costs. A Qwen2.5-0.5B-shaped policy (151,936
tokens, tied embedding, random weights, fp32) on 4 rows of 512 tokens (256 prompt + 256 response): the peak
memory of the log-prob recompute (no grad) and of one training micro-batch (forward + backward of the response
log-probs), for today's full logits (``logprobs_from_logits(model(...).logits / T)``, what dtppo did before
``models.logprobs``) and the chunked head (``token_logprobs``, 128 tokens a chunk), at 1 process and per rank
at dp=2 (FSDP2, gloo), and the critic (the same backbone with a scalar head) for reference. The vocabulary's share
("extra") is each variant's peak minus the floor: the same pass without logits, plus in training the gradient of
the head's weight that training any LM head needs (tied, it meets the embedding's: two [V, H] buffers at once;
"body" is the pass without it). Each measurement is a fresh process (Linux): its peak RSS is reset
once the model is built, and the pass adds its peak minus the RSS before it. Writes
bench/results/perf/memory_vocab.json.

``python -m bench.perf.memory features [--layers 24]``: activation checkpointing and CPU offload (issue 22, part 2). One
training step of the same Qwen2.5-0.5B-shaped policy (chunked head) and critic on one micro-batch of 4 rows x 512
tokens, after a 16-token warm-up step (so AdamW's state exists), with each feature off and on: at 1 process and per
rank at dp=2 (offload only there: a single CPU process is not FSDP-wrapped and the flag does nothing). Each row,
per rank: the RSS resident before the step (parameters, AdamW state, the import floor), the RSS still held after the
forward (what backward needs, mostly activations: what checkpointing removes), the peak of forward + backward and
of the optimizer step (clip + AdamW) over the RSS each started from, and their seconds; on CUDA the device's
allocations too. Writes bench/results/perf/memory_features.json (``--out`` elsewhere); bench/device/gpu.sh records
the same rows on a GPU.

``python -m bench.perf.memory lora [--layers 24]``: what LoRA saves (issue 33). The Qwen2.5-0.5B-shaped policy, its KL
reference and the critic (the same backbone with a scalar head), as the workers hold them, at full fine-tuning
(the reference a frozen copy of the policy) and with LoRA rank 16 and 64 on every linear layer of both models (the
reference is then the policy with its adapters off: no copy). Per rank at dp=1 and dp=2 (FSDP2): the parameters
each model holds, the trainable parameters, AdamW's state after a warm-up step on 16 tokens per rank, and the
process's RSS then (everything resident between steps) and its peak during the warm-up. Writes
bench/results/perf/memory_lora.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common.paths import PERF, REPO
from bench.common.record import kernels_prefix, write_record
from bench.common.shapes import QWEN_05B

DTPPO = [sys.executable, "-m", "dtppo"]
IMPORTS = "import torch, transformers, dtppo.cli, dtppo.ppo.trainer"


def ppo_step(tmp: str, ranks: int) -> list[str]:
    """One PPO step of the demo recipe from a fresh (not SFT-initialised) tiny model, validation included;
    with 2 ranks each trains half of the recipe's 32-sample minibatch in one microbatch."""
    micro = [f"{w}.train_micro_batch_size={32 // ranks}" for w in ("policy", "value")]
    return [
        *DTPPO,
        "ppo",
        "recipes/tiny-math-cpu.yaml",
        "ppo.max_num_steps=1",
        "ppo.init_from_sft=false",
        f"cluster.workers_per_node={ranks}",
        *micro,
        f"logger.log_dir={tmp}/log",
        "logger.progress=false",
        f"checkpointing.checkpoint_dir={tmp}/ckpt",
    ]


def peak_rss_mib(cmd: list[str]) -> tuple[float, float]:
    """Run ``cmd`` in a child with a fresh rusage account; returns (peak RSS MiB, wall s)."""
    probe = (
        "import resource, subprocess, sys, time; t = time.perf_counter(); "
        "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", probe, *cmd], cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    rss, wall = out.stdout.split()[-2:]
    return float(rss), float(wall)


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
            hooks = [
                model.base_model.register_forward_hook(lambda m, a, out: caught.append(out.last_hidden_state)),
                head.register_forward_hook(lambda m, a, out: caught.append(m.weight)),
            ]
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
    _write_rank_result(out, vocab_pass(variant, phase, layers))


def _write_rank_result(out: str, value) -> None:
    from dtppo.distributed.comm import rank

    Path(f"{out}.{rank()}").write_text(json.dumps(value))


def in_child(rank_fn: str, args: tuple, ranks: int, timeout: float | None = None) -> list:
    """``memory.<rank_fn>(*args, out)`` on ``ranks`` ranks of a fresh process (group), killed after ``timeout``
    seconds (None: no limit); each rank's JSON result. On CUDA one process still joins a one-rank group, as dtppo's
    ranks do (``run_ranks``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/result"
        call = ", ".join(repr(a) for a in (*args, out))
        code = (
            "from bench.perf import memory; "
            "from dtppo.distributed.ranks import run_ranks; "
            f"run_ranks(memory.{rank_fn}, {ranks}, {call})"
        )
        env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // ranks)))
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{rank_fn}{args} x{ranks} failed:\n{proc.stderr[-3000:]}")
        return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(ranks)]


def vocab_child(variant: str, phase: str, layers: int, ranks: int) -> float:
    """The largest rank's added MiB, measured in a fresh process (or process group)."""
    return max(in_child("_vocab_rank", (variant, phase, layers), ranks))


def main_vocab(layers: int) -> None:
    command = kernels_prefix() + f"python -m bench.perf.memory vocab --layers {layers}"
    rows = []
    for ranks in (1, 2):
        for phase in ("recompute", "train"):
            added = {v: vocab_child(v, phase, layers, ranks) for v in VARIANTS}
            floor = added["floor"]  # = body when no gradient is computed
            full_extra, chunked_extra = added["full"] - floor, added["chunked"] - floor
            rows.append(
                {
                    "ranks": ranks,
                    "phase": phase,
                    **{f"{v}_added_MiB": added[v] for v in VARIANTS},
                    "full_vocab_extra_MiB": full_extra,
                    "chunked_vocab_extra_MiB": chunked_extra,
                    "chunked_over_full": chunked_extra / full_extra if full_extra > 0 else None,
                    "command": command,
                }
            )
            print(f"dp={ranks} {phase}: " + ", ".join(f"{v} +{added[v]:.0f} MiB" for v in VARIANTS), flush=True)
    print(
        f"\n{'dp':>3} {'phase':<10}{'body':>8}{'floor':>8}{'full':>8}{'chunked':>9}{'critic':>8}"
        f"{'extra: full':>13}{'chunked':>9}{'ratio':>7}   (MiB added to the peak, per rank)"
    )
    for r in rows:
        ratio = "n/a" if r["chunked_over_full"] is None else f"{r['chunked_over_full']:.3f}"
        print(
            f"{r['ranks']:>3} {r['phase']:<10}{r['body_added_MiB']:>8.0f}{r['floor_added_MiB']:>8.0f}"
            f"{r['full_added_MiB']:>8.0f}{r['chunked_added_MiB']:>9.0f}{r['critic_added_MiB']:>8.0f}"
            f"{r['full_vocab_extra_MiB']:>13.0f}{r['chunked_vocab_extra_MiB']:>9.0f}{ratio:>7}"
        )
    meta = {
        "measured_at": time.strftime("%Y-%m-%d %H:%M"),
        "shape": QWEN_05B | {"num_hidden_layers": layers},
        "batch": "4 rows x 512 tokens (256 prompt + 256 response), fp32, CPU",
        "chunk_size": CHUNK,
    }
    write_record(PERF / "memory_vocab.json", {"meta": meta, "rows": rows}, command, indent=2)


FEATURES = ("off", "activation_checkpointing", "cpu_offload")


def features_step(role: str, feature: str, layers: int) -> dict:
    """One training step of ``role`` ("policy" | "critic") with ``feature`` on, after a short warm-up step, phase by
    phase (as Updater.train runs one micro-batch): MiB resident before it, MiB still held after the forward (what
    backward needs: activations), the forward + backward's peak and the optimizer step's (clip + AdamW) peak, each
    over the RSS its phase started from, and each phase's seconds; on CUDA also the device's MiB."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Model

    from dtppo.config import ParallelConfig
    from dtppo.distributed.comm import world_size
    from dtppo.models.logprobs import token_logprobs
    from dtppo.models.value import ValueModel
    from dtppo.ops import masked_sum
    from dtppo.types import Experience
    from dtppo.workers.layout import RankLayout

    torch.manual_seed(0)
    config = Qwen2Config(**(QWEN_05B | {"num_hidden_layers": layers}), max_position_embeddings=4096)
    config._attn_implementation = "sdpa"
    model = Qwen2ForCausalLM(config) if role == "policy" else ValueModel(Qwen2Model(config))
    layout = RankLayout(ParallelConfig(), range(world_size()))
    model = layout.wrap(
        model, activation_checkpointing=feature == "activation_checkpointing", cpu_offload=feature == "cpu_offload"
    )
    engine = _engine(model, layout)

    def batch(rows: int, prompt: int, response: int) -> Experience:
        ids = torch.randint(0, config.vocab_size, (rows, prompt + response))
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

    def loss(micro: Experience):
        if role == "policy":
            logprobs = token_logprobs(
                model, micro.input_ids, micro.attention_mask, micro.response_mask.bool(), 1.0, CHUNK
            )
            return -masked_sum(logprobs * micro.advantages, micro.response_mask), {}
        values = model.values(micro.input_ids, micro.attention_mask)
        return masked_sum((values - micro.returns) ** 2, micro.response_mask), {}

    # The warm-up only has to create AdamW's state: a row of 16 tokens per rank does that at a fraction of the cost.
    engine.train(batch(world_size(), 8, 8), loss, global_batch=world_size(), micro_batch=1)
    exp = batch(4, 256, 256)  # the micro-batch: each of the dp ranks trains 4 / dp of its rows
    micro = exp.shard(layout.dp_rank, layout.dp_size).to(layout.device)
    model.train()
    probe = _Probe(layout.device)
    loss_sum, _ = loss(micro)
    held = probe.added("held_after_forward")
    (loss_sum / exp.response_mask.sum()).backward()
    forward_backward = probe.phase("fwd_bwd")
    engine.optimizer_step(loss_sum.detach())
    return probe.at_start | held | forward_backward | probe.phase("optimizer")


def _engine(model, layout):
    """The workers' Updater (AdamW at its defaults, clipping at 1) for ``model`` on ``layout``'s ranks."""
    from dtppo.config import OptimizerConfig, SchedulerConfig
    from dtppo.workers.updater import Updater

    return Updater(
        model,
        OptimizerConfig(),
        SchedulerConfig(),
        1.0,
        layout.device,
        layout.dp_rank,
        layout.dp_size,
        layout.dp_group,
        model_group=layout.model_group,
    )


class _Probe:
    """This process's RSS (Linux accounting) and, on CUDA, its device allocations, phase by phase."""

    def __init__(self, device):
        import torch

        self.torch, self.cuda = torch, device.type == "cuda"
        self._begin()
        self.at_start = {"resident_MiB": self.rss_start / 1024, "device_resident_MiB": self.device_start}

    def _begin(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()
        self.rss_start = _reset_peak()
        self.device_start = self.torch.cuda.memory_allocated() / 2**20 if self.cuda else None
        self.t = time.perf_counter()

    def added(self, name: str) -> dict:
        """MiB added since the phase began, as ``name`` (and ``device_`` + ``name``)."""
        device = self.torch.cuda.memory_allocated() / 2**20 - self.device_start if self.cuda else None
        return {f"{name}_MiB": (_status_kib("VmRSS") - self.rss_start) / 1024, f"device_{name}_MiB": device}

    def phase(self, name: str) -> dict:
        """The phase ending now, as ``name``: its peak MiB over its start and its seconds; the next one begins."""
        if self.cuda:
            self.torch.cuda.synchronize()
        device = self.torch.cuda.max_memory_allocated() / 2**20 - self.device_start if self.cuda else None
        out = {
            f"{name}_peak_added_MiB": (_status_kib("VmHWM") - self.rss_start) / 1024,
            f"{name}_s": time.perf_counter() - self.t,
            f"device_{name}_peak_added_MiB": device,
        }
        self._begin()
        return out


def _features_rank(role: str, feature: str, layers: int, out: str) -> None:
    _write_rank_result(out, features_step(role, feature, layers))


def features_rows(
    layers: int, ranks: tuple[int, ...], command: str, timeout: Callable[[], float | None] = lambda: None
) -> list[dict]:
    """Every (ranks, role, feature) measurement, each in a fresh process (group) killed after ``timeout()``
    seconds; per rank: the largest rank's memory and the slowest rank's seconds. Offload only where the model is
    FSDP-wrapped (dp > 1, or any GPU run)."""
    rows = []
    for world in ranks:
        for role in ("policy", "critic"):
            for feature in FEATURES:
                if feature == "cpu_offload" and world == 1 and not _cuda():
                    continue
                per_rank = in_child("_features_rank", (role, feature, layers), world, timeout())
                worst = {k: None if per_rank[0][k] is None else max(r[k] for r in per_rank) for k in per_rank[0]}
                rows.append({"ranks": world, "role": role, "feature": feature, **worst, "command": command})
                print(
                    f"dp={world} {role} {feature}: "
                    + ", ".join(f"{k} {v:.1f}" for k, v in worst.items() if v is not None),
                    flush=True,
                )
    return rows


def main_features(layers: int, out: Path) -> None:
    command = kernels_prefix() + f"python -m bench.perf.memory features --layers {layers}"
    rows = features_rows(layers, (1, 2), command)
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
        "shape": QWEN_05B | {"num_hidden_layers": layers},
        "batch": "one micro-batch of 4 rows x 512 tokens (256 prompt + 256 response), split over the dp ranks",
        "precision": "fp32, CPU" if not _cuda() else "bf16 params, fp32 reduce (FSDP2), CUDA",
        "chunk_size": CHUNK,
    }
    write_record(out, {"meta": meta, "rows": rows}, command, indent=2)


LORA_MODES = {"full": 0, "lora-r16": 16, "lora-r64": 64}


def lora_resident(mode: str, layers: int) -> dict:
    """Policy, reference and critic as the workers build them for ``mode``, one warm-up step each; MiB per rank."""
    import copy

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Model

    from dtppo.config import LoraConfig, ParallelConfig
    from dtppo.distributed.comm import world_size
    from dtppo.models.lora import add_adapters
    from dtppo.models.value import ValueModel
    from dtppo.workers.layout import RankLayout

    torch.manual_seed(0)
    config = Qwen2Config(**(QWEN_05B | {"num_hidden_layers": layers}), max_position_embeddings=4096)
    config._attn_implementation = "sdpa"
    lora = LoraConfig(rank=LORA_MODES[mode], alpha=2.0 * max(1, LORA_MODES[mode]))
    policy, backbone = Qwen2ForCausalLM(config), Qwen2Model(config)
    if lora.enabled:
        add_adapters(policy, lora, seed=0)
        add_adapters(backbone, lora, seed=0)
    layout = RankLayout(ParallelConfig(), range(world_size()))
    reference = None if lora.enabled else layout.wrap(copy.deepcopy(policy).eval().requires_grad_(False))
    models = {"policy": layout.wrap(policy), "critic": layout.wrap(ValueModel(backbone))}
    before = _reset_peak()
    ids = torch.randint(0, config.vocab_size, (1, 16))
    engines = {}
    for name, model in models.items():
        engine = engines[name] = _engine(model, layout)
        out = model(input_ids=ids).logits if name == "policy" else model.values(ids, torch.ones_like(ids))
        out.float().square().mean().backward()
        engine.optimizer_step()

    def local_mib(tensors) -> float:  # fp32: 4 bytes each, this rank's shard of a sharded tensor
        return sum((t.to_local() if hasattr(t, "to_local") else t).numel() for t in tensors) * 4 / 2**20

    row = {
        f"{name}_params_MiB": local_mib(m.parameters())
        for name, m in (models | {"reference": reference}).items()
        if m is not None
    }
    row["reference_params_MiB"] = row.get("reference_params_MiB", 0.0)
    row["trainable_params"] = sum(
        (p.to_local() if hasattr(p, "to_local") else p).numel()
        for m in models.values()
        for p in m.parameters()
        if p.requires_grad
    )
    row["optimizer_state_MiB"] = local_mib(
        t for e in engines.values() for state in e.optimizer.state.values() for t in state.values() if t.dim() > 0
    )
    row["resident_MiB"] = _status_kib("VmRSS") / 1024
    row["warmup_peak_MiB"] = _status_kib("VmHWM") / 1024
    row["resident_before_warmup_MiB"] = before / 1024
    cuda = layout.device.type == "cuda"  # on a GPU what matters is the device's: allocated between steps, peak
    row["device_resident_MiB"] = torch.cuda.memory_allocated() / 2**20 if cuda else None
    row["device_peak_MiB"] = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    return row


def _lora_rank(mode: str, layers: int, out: str) -> None:
    _write_rank_result(out, lora_resident(mode, layers))


def lora_rows(
    layers: int, ranks: tuple[int, ...], command: str, timeout: Callable[[], float | None] = lambda: None
) -> list[dict]:
    """Every (ranks, mode) measurement, each in a fresh process (group) killed after ``timeout()`` seconds; per
    rank: the largest rank's figures."""
    rows = []
    for world in ranks:
        for mode in LORA_MODES:
            per_rank = in_child("_lora_rank", (mode, layers), world, timeout())
            worst = {k: None if per_rank[0][k] is None else max(r[k] for r in per_rank) for k in per_rank[0]}
            rows.append({"ranks": world, "mode": mode, **worst, "command": command})
            shown = ", ".join(f"{k} {v:,.0f}" for k, v in worst.items() if v is not None)
            print(f"dp={world} {mode}: {shown}", flush=True)
    return rows


def main_lora(layers: int) -> None:
    command = kernels_prefix() + f"python -m bench.perf.memory lora --layers {layers}"
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
        "precision": "fp32, CPU" if not _cuda() else "bf16 params, fp32 reduce (FSDP2), CUDA",
    }
    out = PERF / "memory_lora.json"
    write_record(out, {"meta": meta, "rows": rows}, command, indent=2)
    print(f"wrote {out}")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", nargs="?", choices=["ppo", "vocab", "features", "lora"], default="ppo")
    parser.add_argument("--layers", type=int, default=QWEN_05B["num_hidden_layers"])
    parser.add_argument(
        "--out",
        default=str(PERF / "memory_features.json"),
        help="features: the JSON path",
    )
    args = parser.parse_args()
    if args.what == "vocab":
        main_vocab(args.layers)
    elif args.what == "features":
        main_features(args.layers, Path(args.out))
    elif args.what == "lora":
        main_lora(args.layers)
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
            rows.append(
                {
                    "case": name,
                    "peak_rss_MiB": rss,
                    "wall_s": wall,
                    "run": shown,
                    "command": kernels_prefix() + "python -m bench.perf.memory",
                }
            )
    print(f"{'case':<48}{'peak RSS MiB':>14}{'wall s':>9}")
    for r in rows:
        print(f"{r['case']:<48}{r['peak_rss_MiB']:>14.0f}{r['wall_s']:>9.1f}")
    payload = {"measured_at": time.strftime("%Y-%m-%d %H:%M"), "rows": rows}
    write_record(PERF / "memory.json", payload, rows[0]["command"], indent=2)


if __name__ == "__main__":
    main()
