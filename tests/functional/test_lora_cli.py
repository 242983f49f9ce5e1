"""`dtppo ppo` with LoRA on the policy and the critic: a resume from the previous checkpoint reproduces the run's
last step exactly, and `dtppo export` writes merged HF models and the adapters alone in PEFT's format, each loading
in plain transformers / PEFT and computing what the trained models compute."""

import json
import shutil

import pytest
import torch
from peft import PeftModel
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForTokenClassification

from tests.support.cli import checkpoint_tensors, read_jsonl, run_cli
from tests.support.recipes import FAST, TINY

LORA = ["policy.lora.rank=8", "value.lora.rank=8", "loss.kl.coef=0.05", "policy.optimizer.lr=1e-3"]


def _args(name: str) -> list:
    return [
        "ppo",
        TINY,
        *FAST,
        *LORA,
        "ppo.init_from_sft=false",
        "ppo.max_num_steps=2",
        "ppo.validation.period=2",
        f"logger.log_dir={name}/log",
        f"checkpointing.checkpoint_dir={name}/ckpt",
        "checkpointing.save_period=1",
        "checkpointing.keep_last=5",
    ]


def _comparable(record):
    return {k: v for k, v in record.items() if not k.startswith(("timing/", "perf/"))}


@pytest.mark.slow  # three CLI runs; LoRA: tests/unit/models, tests/distributed/test_lora_ranks.py
def test_lora_run_resumes_exactly_and_exports_merged_and_adapter(tmp_path):
    first = run_cli(_args("run"), tmp_path)
    assert "policy: LoRA rank 8" in first.stdout and "value: LoRA rank 8" in first.stdout
    ckpt = tmp_path / "run/ckpt"
    reference_metrics = [_comparable(r) for r in read_jsonl(tmp_path / "run/log/metrics.jsonl")]
    # The torch generator samples a merged copy refitted after each update: its log-probs are the trainer's.
    assert all(r["train/seq_mult_prob_error/max"] <= 1 + 1e-5 for r in reference_metrics if r["step"] >= 1)
    reference = checkpoint_tensors(ckpt / "step_2", tmp_path)
    shutil.rmtree(ckpt / "step_2")

    resumed = run_cli(_args("run"), tmp_path)
    assert "resumed from" in resumed.stdout and "run/ckpt/step_1" in resumed.stdout
    assert [_comparable(r) for r in read_jsonl(tmp_path / "run/log/metrics.jsonl")] == reference_metrics
    again = checkpoint_tensors(ckpt / "step_2", tmp_path)
    assert again.keys() == reference.keys() and all(torch.equal(again[k], reference[k]) for k in reference)
    # The adapters and the value head have optimizer state; the frozen base has none.
    optim = [k for k in reference if ".optim." in k]
    assert optim and all(".lora_" in k or ".score." in k for k in optim)
    assert any(".score." in k for k in optim)

    run_cli(["export", ckpt, tmp_path / "hf"], tmp_path)
    hf = tmp_path / "hf"
    ids = torch.randint(3, 40, (2, 12), generator=torch.Generator().manual_seed(0))
    merged = AutoModelForCausalLM.from_pretrained(hf / "policy").eval()
    adapter_config = json.loads((hf / "policy-adapter" / "adapter_config.json").read_text())
    assert adapter_config["r"] == 8 and adapter_config["base_model_name_or_path"] == str((hf / "policy-base").resolve())
    base = AutoModelForCausalLM.from_pretrained(adapter_config["base_model_name_or_path"]).eval()
    with torch.no_grad():
        plain_logits = base(input_ids=ids).logits
        adapted = PeftModel.from_pretrained(base, hf / "policy-adapter").eval()
        merged_logits, adapted_logits = merged(input_ids=ids).logits, adapted(input_ids=ids).logits
    assert float((merged_logits - adapted_logits).abs().max()) < 1e-5
    assert float((merged_logits - plain_logits).abs().max()) > 1e-4  # the adapter trained

    critic = AutoModelForTokenClassification.from_pretrained(hf / "critic").eval()
    backbone = PeftModel.from_pretrained(AutoModel.from_pretrained(hf / "critic-base"), hf / "critic-adapter").eval()
    with torch.no_grad():
        head = critic(input_ids=ids).logits.squeeze(-1)
        hidden = backbone(input_ids=ids).last_hidden_state
        from_adapter = critic.score(hidden).squeeze(-1)
    assert float((head - from_adapter).abs().max()) < 1e-5
