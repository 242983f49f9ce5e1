"""``dtppo sft`` where PPO runs: on the policy's ranks, sharded as the policy is (FSDP2 at dp=2, tensor parallel at
tp=2, context parallel at cp=2), the same model, loss and grad norm as one process within float round-off; a custom
task trained on its target column and validated by the targets' loss; a custom task without one refused with one
line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.cli import read_jsonl, run_cli, run_cli_in_process
from tests.support.recipes import REPO, TINY

STEPS = 6
SHORT = [
    f"sft.num_steps={STEPS}",
    "sft.careless_stage.num_steps=0",
    "sft.batch_size=8",
    "sft.log_period=1",
    # Adam's first step is lr·g/(|g| + eps): eps = 1e-6 keeps round-off in tiny gradient entries (summation order
    # differs across ranks) from becoming a full lr-sized step, so the comparison is about the sharding.
    "sft.optimizer.eps=1e-6",
    "ppo.validation.max_samples=16",
    "ppo.validation.batch_size=16",
    "logger.tensorboard=false",
    "logger.progress=false",
]


def _sft(root: Path, name: str, *extra: str):
    out = root / name
    proc = run_cli(["sft", TINY, *SHORT, f"sft.output_dir={out}", *extra], root)
    records = [r for r in read_jsonl(root / f"{name}_logs" / "metrics.jsonl") if "sft/loss" in r]
    # Clipping and Adam would hide a gradient counted twice; its norm shows it.
    curves = [(r["sft/loss"], r["sft/grad_norm"]) for r in records]
    results = json.loads((out / "sft_results.json").read_text())
    return proc, load_file(out / "model.safetensors"), curves, results


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    return _sft(tmp_path_factory.mktemp("sft_ranks"), "dp1")


@pytest.mark.slow  # SFT at 2 ranks (dp, cp, tp); the layouts' parity: tests/distributed
@pytest.mark.parametrize(
    "name, layout",
    [
        ("dp2", ["cluster.workers_per_node=2"]),
        # each rank holds half of every row's tokens: the log-probs gathered, every token's gradient counted once
        ("cp2", ["cluster.workers_per_node=2", "policy.parallel.cp=2"]),
        # slow: SFT wraps the model with the policy's layout code, whose tp=2 parity tests/distributed checks
        pytest.param("tp2", ["cluster.workers_per_node=2", "policy.parallel.tp=2"], marks=pytest.mark.slow),
    ],
)
def test_sft_on_two_ranks_trains_the_model_one_process_trains(one_process, tmp_path, name, layout):
    _, single, single_curves, single_results = one_process
    proc, sharded, curves, results = _sft(tmp_path, name, *layout)
    assert len(curves) == STEPS and single_curves[-1][0] < single_curves[0][0]  # it trained
    for (single_loss, single_norm), (loss, norm) in zip(single_curves, curves):
        assert loss == pytest.approx(single_loss, abs=1e-5) and norm == pytest.approx(single_norm, rel=1e-5)
    assert single.keys() == sharded.keys()
    assert max(float((single[k] - sharded[k]).abs().max()) for k in single) < 1e-5
    # greedy answers of the same model: at most one of the 16 flips on a near-tie
    assert abs(results["sft/accuracy"] - single_results["sft/accuracy"]) <= 1 / 16
    assert results["sft/steps"] == STEPS and "sft/accuracy" in proc.stdout  # the results table


def _custom_rows(path: Path, count: int, offset: int) -> None:
    rows = [{"prompt": f"Write {n} stars", "target": "*" * n} for n in range(offset, offset + count)]
    path.write_text("".join(json.dumps({**r, "n": i % 5}) + "\n" for i, r in enumerate(rows)))


def _custom_args(tmp_path: Path, *extra: str) -> list:
    _custom_rows(tmp_path / "train.jsonl", 40, 0)
    _custom_rows(tmp_path / "val.jsonl", 8, 1)
    return [
        "sft",
        REPO / "recipes" / "base.yaml",
        "data.task=custom",
        "data.train.path=train.jsonl",
        "data.validation.path=val.jsonl",
        "reward.functions=[gsm8k]",  # any function: SFT never scores, but a custom task's recipe must name one
        "sft.output_dir=model",
        "sft.num_steps=24",
        "sft.val_period=8",
        "sft.batch_size=8",
        "sft.careless_stage.num_steps=0",
        "logger.tensorboard=false",
        "logger.progress=false",
        *extra,
    ]


def test_sft_trains_a_custom_task_on_its_target_column(tmp_path):
    proc = run_cli(_custom_args(tmp_path, "data.answer_key=target"), tmp_path)
    records = read_jsonl(tmp_path / "model_logs" / "metrics.jsonl")
    curve = [(r["step"], r["sft/validation_loss"]) for r in records if "sft/validation_loss" in r]
    assert [step for step, _ in curve] == [8, 16, 24, 24]  # every val_period, and the results record
    assert curve[1][1] < curve[0][1] and all(0 < loss < 20 for _, loss in curve), curve
    results = json.loads((tmp_path / "model" / "sft_results.json").read_text())
    assert results["sft/validation_loss"] == curve[-1][1] and "sft/accuracy" not in results
    assert "sft/validation_loss" in proc.stdout
    assert all(torch.isfinite(t).all() for t in load_file(tmp_path / "model" / "model.safetensors").values())


def test_sft_of_a_custom_task_without_a_target_column_is_refused(tmp_path, monkeypatch, capsys):
    code, _, err = run_cli_in_process(_custom_args(tmp_path), tmp_path, monkeypatch, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "dtppo: config error: data.answer_key: SFT trains on a target column, and data.task custom names none"
    ), err
    assert not (tmp_path / "model").exists()
