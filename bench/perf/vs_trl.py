"""Seconds per PPO step: dtppo's PPOTrainer.step() against TRL's experimental PPOTrainer (trl==1.12.0, the last
release that has one) on the same tiny Qwen2 policy and critic, prompts, batch and response length, with 1 PPO
epoch and 1 minibatch, fp32 on CPU. Prints a table and writes bench/results/perf/vs_trl.json; each row also gives
the fraction of the fp32 matmul peak (measured in the same run) that its step's useful model FLOPs reach.

    python -m bench.perf.vs_trl [--steps 4] [--rounds 2] [--threads 2]

TRL runs in a subprocess with its own venv (bench/.venv-trl, built here on first use from the local package
index), so it never touches .venv. Rounds alternate TRL and dtppo so that load from other processes on a
shared machine falls on both; each round starts fresh processes/trainers and discards its first step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import transformers

from bench.common.paths import PERF, REPO
from bench.common.record import command_line, write_record
from bench.common.workload import matmul_peak_gflops, train_flops
from dtppo import config as config_lib
from dtppo.data.loader import PromptLoader, build_sources, encode_prompts
from dtppo.models.causal_lm import build_causal_lm, tiny_qwen2_config
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.models.value import ValueModel, build_backbone
from dtppo.ppo.trainer import PPOTrainer

RECIPE = REPO / "recipes" / "tiny-math-cpu.yaml"
TRL_VENV = REPO / "bench" / ".venv-trl"
TRL_VERSION = "1.12.0"
GOAL = 5.0  # dtppo at least this many times faster per step
VOCAB = len(build_char_tokenizer())
# dtppo as the recipe runs it (sequences packed, no pad tokens computed) and padded like TRL's batches.
DTPPO_VARIANTS = {
    "dtppo (packed, recipe default)": [],
    "dtppo (padded)": ["policy.sequence_packing=false", "value.sequence_packing=false"],
}

# What each side does per step beyond the shared work, stated in the JSON and in docs/performance.md.
WORK_DIFFERENCES = [
    "reward: TRL runs a reward-model forward (a Qwen2 token-classification model with the critic's dimensions); "
    "dtppo decodes the responses and runs its math verifier",
    "pi_old: TRL reuses the log-probs of the generation logits it kept (output_scores); dtppo recomputes them "
    "with a policy forward (docs/design.md), so both do 3 no-grad forwards (TRL: ref, value, reward; dtppo: value, "
    "policy, ref)",
    "update: TRL sums policy and value losses into one backward and one AdamW step over both models; dtppo runs "
    "a critic update, then a policy update, each with its own AdamW",
    "generation: both sample at T=1 from the full vocabulary and stop once every row has sampled EOS (TRL: "
    "HF generate with stop_token=eos; dtppo: its static-KV sampler); TRL's batches are a shuffle of the same "
    "prompts",
    "padding: TRL computes over padded [B, prompt + response] rows; dtppo's recipe default packs each batch's "
    "sequences (no pad token computed); the 'dtppo (padded)' row turns packing off and computes padded rows too",
    "TRL calls gc.collect() twice per step and computes a full-softmax entropy per training microbatch",
]


def dtppo_overrides(batch: int, response_length: int) -> list[str]:
    """The recipe with TRL's step shape: one minibatch and one microbatch of ``batch`` samples, KL to a
    frozen reference in the reward (k1, coefficient 0.05), GAE λ 0.95, value clip 0.2."""
    per_model = [
        f"{m}.{k}={batch}" for m in ("policy", "value") for k in ("train_global_batch_size", "train_micro_batch_size")
    ]
    return [
        "ppo.init_from_sft=false",
        f"ppo.num_prompts_per_step={batch}",
        "ppo.num_generations_per_prompt=1",
        "ppo.ppo_epochs=1",
        "ppo.lambda_policy=0.95",
        "ppo.lambda_value=0.95",
        "ppo.gamma=1.0",
        f"policy.generation.max_new_tokens={response_length}",
        "policy.generation.temperature=1.0",
        "policy.generation.top_p=1.0",
        f"policy.logprob_batch_size={batch}",
        f"value.inference_batch_size={batch}",
        *per_model,
        "loss.kl_coef=0.05",
        "loss.kl_in_reward=true",
        "loss.kl_estimator=k1",
        "loss.value_clip=0.2",
        "reward.num_workers=0",
        "logger.tensorboard=false",
        "checkpointing.enabled=false",
    ]


def ensure_trl_venv() -> Path:
    """bench/.venv-trl with torch 2.13.0 (CPU wheel first, so no CUDA build is pulled) and trl 1.12.0."""
    python = TRL_VENV / "bin" / "python"
    probe = [str(python), "-c", f"import trl, sys; sys.exit(trl.__version__ != '{TRL_VERSION}')"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(f"building {TRL_VENV} (torch 2.13.0, trl {TRL_VERSION}) ...", flush=True)
    subprocess.run(["python3.11", "-m", "venv", str(TRL_VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)
    subprocess.run([*pip, f"trl=={TRL_VERSION}", f"transformers=={transformers.__version__}"], check=True)
    return python


def step_prompts(cfg, tokenizer, batch: int, steps: int) -> list[list[int]]:
    """The prompts dtppo's trainer draws in its first ``steps`` steps (same loader, same seed)."""
    loader = PromptLoader(build_sources(cfg)[0], cfg.ppo.seed)
    prompts: list[list[int]] = []
    for _ in range(steps):
        prompts += encode_prompts(tokenizer, loader.next_batch(batch), cfg.data)
    return prompts


def write_trl_inputs(cfg, directory: Path, prompts: list[list[int]]) -> None:
    """dtppo's initial policy and critic as HF directories, the tokenizer, and the prompts."""
    tokenizer = build_char_tokenizer()
    tokenizer.save_pretrained(directory / "tokenizer")
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    build_causal_lm(None, cfg.policy.model.tiny, len(tokenizer), pad, eos, cfg.ppo.seed).save_pretrained(
        directory / "policy"
    )
    backbone = build_backbone(None, tiny_qwen2_config(cfg.value.model.tiny, len(tokenizer), pad, eos), cfg.ppo.seed)
    ValueModel(backbone, seed=cfg.ppo.seed, init_std=cfg.value.head_init_std).save_pretrained(directory / "value")
    (directory / "prompts.json").write_text(json.dumps(prompts))


def run_trl(python: Path, directory: Path, batch: int, response_length: int, steps: int, threads: int) -> dict:
    out = directory / "trl.json"
    cmd = [
        str(python),
        str(REPO / "bench" / "trl_ppo_worker.py"),
        "--model-dir",
        str(directory),
        "--prompts",
        str(directory / "prompts.json"),
        "--batch",
        str(batch),
        "--response-length",
        str(response_length),
        "--steps",
        str(steps),
        "--threads",
        str(threads),
        "--out",
        str(out),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"TRL worker failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def run_dtppo(cfg, steps: int) -> dict:
    trainer = PPOTrainer(cfg)
    seconds, cpu_seconds, phases, widths = [], [], [], []
    try:
        for _ in range(steps):
            start, cpu_start = time.perf_counter(), time.process_time()
            metrics = trainer.step()
            seconds.append(time.perf_counter() - start)
            cpu_seconds.append(time.process_time() - cpu_start)
            phases.append(
                {
                    k.removeprefix("timing/"): v
                    for k, v in metrics.items()
                    if k.startswith("timing/") and k != "timing/step"
                }
            )
            widths.append(metrics["train/mean_gen_tokens_per_sample"])
    finally:
        if trainer.scorer is not None:
            trainer.scorer.close()
    return {"step_seconds": seconds, "step_cpu_seconds": cpu_seconds, "phases": phases, "mean_response_tokens": widths}


def _median_phases(phase_steps: list[dict]) -> dict[str, float]:
    names = sorted({name for step in phase_steps for name in step})
    return {name: statistics.median(step.get(name, 0.0) for step in phase_steps) for name in names}


def useful_step_flops(cfg, prompts: list[list[int]], batch: int, response_tokens: float) -> float:
    """Model FLOPs of one step on useful (non-pad) tokens, the same for both systems (bench/common/workload.py's
    formula): generation ≈ one policy forward, three no-grad forwards (two policy-sized, one critic-sized),
    then forward + backward of policy and critic. Rows are taken as prompt + the mean response length."""
    lengths = torch.tensor([len(p) + response_tokens for p in prompts[:batch]])
    policy, critic = vars(cfg.policy.model.tiny), vars(cfg.value.model.tiny)
    forward_policy = train_flops(policy, VOCAB, lengths) / 3
    forward_critic = train_flops(critic, 1, lengths) / 3
    return 6 * forward_policy + 4 * forward_critic


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4, help="measured steps per round (one more is a warm-up)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--response-length", type=int, default=48)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    command = command_line()
    base = dtppo_overrides(args.batch, args.response_length)
    configs = {name: config_lib.load(RECIPE, base + extra) for name, extra in DTPPO_VARIANTS.items()}
    cfg = configs[next(iter(configs))]
    python = ensure_trl_venv()
    load_before = os.getloadavg()
    # Peak per CPU-second, set against each step's CPU seconds: both leave out time spent waiting for a core.
    peak = matmul_peak_gflops()["cpu"] * 1e9
    runs: dict[str, dict[str, list]] = {
        name: {"steps": [], "cpu": [], "phases": [], "extra": []} for name in ["trl", *configs]
    }
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        prompts = step_prompts(cfg, build_char_tokenizer(), args.batch, args.steps + 1)
        write_trl_inputs(cfg, directory, prompts)
        for _ in range(args.rounds):
            trl = run_trl(python, directory, args.batch, args.response_length, args.steps + 1, args.threads)
            _collect(runs["trl"], trl, trl["widths"])
            for name, variant_cfg in configs.items():
                dt = run_dtppo(variant_cfg, args.steps + 1)
                _collect(runs[name], dt, dt["mean_response_tokens"])
    response_tokens = statistics.mean(runs[next(iter(configs))]["extra"])
    flops = useful_step_flops(cfg, prompts, args.batch, response_tokens)
    rows = _rows(runs, trl["trl"], command, flops, peak)
    _print(rows, flops, peak)
    meta = {
        "args": vars(args),
        "threads": args.threads,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "shared_machine": True,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl["trl"],
        "useful_flops_per_step": flops,
        "fp32_matmul_peak_gflops_per_cpu_s": peak / 1e9,
        "flop_floor_cpu_s": flops / peak,
        "work_differences": WORK_DIFFERENCES,
    }
    write_record(PERF / "vs_trl.json", {"meta": meta, "rows": rows}, command, indent=2)


def _collect(run: dict, result: dict, extra: list) -> None:
    """Keep all but each round's first step (warm-up: allocation, first kernels)."""
    run["steps"] += result["step_seconds"][1:]
    run["cpu"] += result["step_cpu_seconds"][1:]
    run["phases"] += result["phases"][1:]
    run["extra"] += extra[1:]


def _rows(runs: dict, trl_version: str, command: str, flops: float, peak: float) -> list[dict]:
    trl_s, trl_cpu = statistics.median(runs["trl"]["steps"]), statistics.median(runs["trl"]["cpu"])
    rows = []
    for name, run in runs.items():
        median, cpu = statistics.median(run["steps"]), statistics.median(run["cpu"])
        # Process CPU time leaves out time the process waited for a core, so on a shared machine it is the
        # steadier of the two (it equals the work done when running on one thread).
        row = {
            "system": f"TRL {trl_version} PPOTrainer" if name == "trl" else name,
            "step_s_median": median,
            "step_cpu_s_median": cpu,
            "step_s_all": run["steps"],
            "step_cpu_s_all": run["cpu"],
            "phases_s_median": _median_phases(run["phases"]),
            "fp32_peak_fraction": flops / cpu / peak,
            "command": command,
        }
        if name == "trl":
            row["trained_columns"] = run["extra"]
        else:
            row |= {
                "mean_response_tokens": run["extra"],
                "speedup_vs_trl": trl_s / median,
                "cpu_time_speedup_vs_trl": trl_cpu / cpu,
                "goal": GOAL,
                "meets_goal": trl_s / median >= GOAL,
            }
        rows.append(row)
    return rows


def _print(rows: list[dict], flops: float, peak: float) -> None:
    print(f"{'system':<32}{'s/step':>8}{'ratio':>7}{'cpu s':>7}{'ratio':>7}{'goal':>6}{'% peak':>8}   phases (s)")
    for r in rows:
        ratio = f"{r['speedup_vs_trl']:.2f}x" if "speedup_vs_trl" in r else "1.00x"
        cpu_ratio = f"{r['cpu_time_speedup_vs_trl']:.2f}x" if "speedup_vs_trl" in r else "1.00x"
        goal = f">={r['goal']:.0f}x" if "goal" in r else ""
        phases = ", ".join(f"{k} {v:.2f}" for k, v in r["phases_s_median"].items() if v >= 0.005)
        print(
            f"{r['system']:<32}{r['step_s_median']:>8.2f}{ratio:>7}{r['step_cpu_s_median']:>7.2f}{cpu_ratio:>7}"
            f"{goal:>6}{100 * r['fp32_peak_fraction']:>7.1f}%   {phases}"
        )
    print(
        f"useful model FLOPs per step {flops / 1e9:.1f} G; at the measured fp32 matmul peak "
        f"({peak / 1e9:.0f} GFLOP per CPU-second) a step would take {flops / peak:.2f} CPU-s; '% peak' uses CPU s"
    )
    print("(shared 2-core machine: other processes ran alongside; see load_average_* in the JSON)")


if __name__ == "__main__":
    main()
