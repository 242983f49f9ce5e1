"""4 PPO steps straight equal 2 steps + resume + 2 steps: metrics and weights."""

import pytest
import torch

from tests.support.cli import checkpoint_tensors, read_jsonl, run_cli
from tests.support.recipes import FAST, TINY


def _args(sft_dir, name, steps):
    return [
        "ppo",
        TINY,
        *FAST,
        f"sft.output_dir={sft_dir}",
        f"ppo.max_num_steps={steps}",
        "ppo.validation.period=2",
        f"logger.log_dir={name}/log",
        f"checkpointing.checkpoint_dir={name}/ckpt",
        "checkpointing.save_period=2",
        "checkpointing.keep_last=5",
    ]


def _comparable(record):
    return {k: v for k, v in record.items() if not k.startswith(("timing/", "perf/"))}


@pytest.mark.slow  # make test's resume checks: tests/functional/test_kill.py (kill, resume, compare) at 1 rank
def test_resume_reproduces_the_uninterrupted_run(sft_dir, tmp_path):
    run_cli(_args(sft_dir, "straight", 4), tmp_path)
    run_cli(_args(sft_dir, "split", 2), tmp_path)
    proc = run_cli(_args(sft_dir, "split", 4), tmp_path)
    assert "resumed from" in proc.stdout and "split/ckpt/step_2" in proc.stdout

    straight = read_jsonl(tmp_path / "straight/log/metrics.jsonl")
    split = read_jsonl(tmp_path / "split/log/metrics.jsonl")
    assert [r["step"] for r in split] == [0, 1, 2, 3, 4]
    assert [_comparable(r) for r in split] == [_comparable(r) for r in straight]

    a = checkpoint_tensors(tmp_path / "straight/ckpt/step_4", tmp_path)
    b = checkpoint_tensors(tmp_path / "split/ckpt/step_4", tmp_path)
    assert a.keys() == b.keys() and any(".model." in k for k in a) and any(".optim." in k for k in a)
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]), name
    trainer_a = torch.load(tmp_path / "straight/ckpt/step_4/trainer.pt", weights_only=True)
    trainer_b = torch.load(tmp_path / "split/ckpt/step_4/trainer.pt", weights_only=True)
    assert trainer_a["rollouts"] == trainer_b["rollouts"] and trainer_a["steps_done"] == trainer_b["steps_done"] == 4
