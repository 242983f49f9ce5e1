"""The CLI on HF model directories in the real formats (tests/support/hf_fixtures.py): PPO, eval, export and a reload
with plain transformers, on GSM8K rows, with both generation backends and at 2 ranks.

Each fixture runs once per backend, and each backend once at 2 ranks: Qwen2.5-format with torch at 2 ranks (then
eval, export and reload) and with vLLM at 1; Llama-2-format (no pad token) with torch at 1 (then export and reload)
and with vLLM at 2. ``dtppo eval`` with the vLLM engine is tests/functional/test_vllm.py's.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dtppo.models.value import ValueModel
from tests.support.cli import checkpoint_tensors, read_jsonl, run_cli
from tests.support.hf_fixtures import GSM8K_TEST, GSM8K_TRAIN
from tests.support.recipes import FAST, TINY

MAX_NEW = 32
# The shared fast settings, then this file's own (the later override wins): GSM8K rows from a random start,
# 2 steps of 8 prompts with 2 samples each, logs and checkpoints in the working directory, one scoring process.
SMALL = [
    *FAST,
    "ppo.init_from_sft=false",
    "data.task=gsm8k",
    "ppo.max_num_steps=2",
    "ppo.num_prompts_per_step=8",
    "ppo.num_generations_per_prompt=2",
    "ppo.validation.period=2",
    "ppo.validation.max_samples=8",
    "ppo.validation.batch_size=8",
    f"policy.generation.max_new_tokens={MAX_NEW}",
    "logger.log_dir=log",
    "checkpointing.checkpoint_dir=ckpt",
    "checkpointing.save_period=2",
    "reward.num_workers=1",
]
VLLM = ["policy.generation.backend=vllm", "policy.generation.vllm_kv_cache_mib=64"]
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")


def _rows(source: Path, target: Path, count: int) -> Path:
    target.write_text("".join(source.read_text().splitlines(keepends=True)[:count]))
    return target


def _ppo(model: Path, cwd: Path, *extra: str):
    data = [
        f"data.train.path={_rows(GSM8K_TRAIN, cwd / 'train.jsonl', 64)}",
        f"data.validation.path={_rows(GSM8K_TEST, cwd / 'test.jsonl', 8)}",
    ]
    args = [TINY, *SMALL, f"policy.model.path={model}", *data, *extra]
    return args, run_cli(["ppo", *args], cwd)


def _steps(cwd: Path) -> list[dict]:
    return [r for r in read_jsonl(cwd / "log" / "metrics.jsonl") if r["step"] >= 1]


def _eval_lines(proc) -> dict[str, str]:
    table = proc.stdout.split("evaluation\n", 1)[1].split("\n\n", 1)[0]
    return dict(line.split() for line in table.splitlines()[1:] if line.strip())


def _copy(model: Path, cwd: Path) -> Path:
    """A private copy of a fixture: the export test deletes it."""
    return Path(shutil.copytree(model, cwd / "model"))


def _assert_stops_at_the_generation_config_token(steps: list[dict]) -> None:
    # <|endoftext|> is a stop token only through generation_config.json, and the fixture's model samples it ~1 time
    # in 7; with the tokenizer's EOS alone almost every response ran to max_new_tokens (truncation ~1)
    for r in steps:
        assert r["train/truncation_rate"] < 0.3, r
        assert r["train/mean_gen_tokens_per_sample"] < MAX_NEW / 2, r
    # greedy validation: the model's first choice is <|endoftext|>, so each answer is that one token, as
    # transformers.generate gives (it used to run 32 tokens of <|endoftext|>)
    assert steps[-1]["validation/avg_length"] == 1.0


@pytest.mark.slow  # 2 ranks, eval and export; an HF format end to end in make test: the Llama run below
def test_qwen_format_torch_at_two_ranks_then_eval_export_and_reload(qwen_dir, tmp_path):
    model = _copy(qwen_dir, tmp_path)
    args, proc = _ppo(model, tmp_path, "cluster.workers_per_node=2")
    steps = _steps(tmp_path)
    assert [r["step"] for r in steps] == [1, 2] and "dtppo results" in proc.stdout
    _assert_stops_at_the_generation_config_token(steps)
    evaluation = _eval_lines(run_cli(["eval", *args], tmp_path))
    assert evaluation["step"] == "2" and float(evaluation["avg_length"]) == 1.0

    # the checkpoint carries the configs and the tokenizer, and the tied embedding once
    step_dir = tmp_path / "ckpt" / "step_2"
    assert sorted(p.name for p in (step_dir / "hf" / "policy").iterdir()) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    saved = checkpoint_tensors(step_dir, tmp_path)
    assert "policy.model.model.embed_tokens.weight" in saved and "policy.model.lm_head.weight" not in saved
    shutil.rmtree(model)  # export needs only the checkpoint
    run_cli(["export", tmp_path / "ckpt", tmp_path / "hf"], tmp_path)

    policy = AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / "policy").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf" / "policy")
    assert policy.lm_head.weight is policy.model.embed_tokens.weight  # tied again
    for name, tensor in policy.state_dict().items():
        source = "model.embed_tokens.weight" if name == "lm_head.weight" else name
        assert torch.equal(tensor, saved[f"policy.model.{source}"]), name
    assert policy.generation_config.eos_token_id == [
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    ]
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Tom has 3 apples."}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>assistant\n") and "You are a helpful assistant." in prompt
    critic = ValueModel.from_pretrained(tmp_path / "hf" / "critic")
    for name, tensor in critic.state_dict().items():
        assert torch.equal(tensor, saved[f"value.model.{name}"]), name


@needs_vllm
@pytest.mark.slow  # the vllm backend's CLI runs are test_vllm.py's, Qwen's format and stop token the torch run above
def test_qwen_format_vllm(qwen_dir, tmp_path):
    _, proc = _ppo(qwen_dir, tmp_path, *VLLM)
    steps = _steps(tmp_path)
    assert [r["step"] for r in steps] == [1, 2]
    _assert_stops_at_the_generation_config_token(steps)
    for r in steps:
        assert r["train/token_mult_prob_error"] < 1.01, r  # vLLM's fp32 log-probs against the trainer's
    assert "Chat template warmup failed" not in proc.stderr and "Traceback" not in proc.stderr


def test_llama_format_without_pad_token_torch_then_export_and_reload(llama_dir, tmp_path):
    _ppo(llama_dir, tmp_path)
    steps = _steps(tmp_path)
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert 0.0 <= r["train/reward"] <= 1.0 and r["train/token_mult_prob_error"] < 1.01, r
    run_cli(["export", tmp_path / "ckpt", tmp_path / "hf"], tmp_path)
    policy = AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / "policy")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf" / "policy")
    saved = checkpoint_tensors(tmp_path / "ckpt" / "step_2", tmp_path)
    assert "policy.model.lm_head.weight" in saved  # untied: its own tensor
    for name, tensor in policy.state_dict().items():
        assert torch.equal(tensor, saved[f"policy.model.{name}"]), name
    assert tokenizer.bos_token == "<s>" and tokenizer.eos_token == "</s>"
    assert tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False) == "<s>[INST] Hi [/INST]"


@pytest.mark.slow  # vLLM at 2 ranks is covered by test_vllm.py, Llama's format by the torch run above
@needs_vllm
def test_llama_format_vllm_at_two_ranks(llama_dir, tmp_path):
    _, proc = _ppo(llama_dir, tmp_path, *VLLM, "cluster.workers_per_node=2")
    steps = _steps(tmp_path)
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["train/token_mult_prob_error"] < 1.01, r
    assert "Chat template warmup failed" not in proc.stderr and "Traceback" not in proc.stderr
