"""`dtppo ppo ... cluster.workers_per_node=2`: two gloo ranks started by the CLI itself.

Checks: the reference gates; the first step's metrics equal the single-process run's (rollouts are
layout-invariant); context parallelism (cp=2) trains as one process does, and its checkpoints resume across cp=1
and cp=2; a checkpoint written at dp=2 resumes at dp=1 and at dp=2 with the same next step; export
of a sharded checkpoint gives consolidated HF weights; the tiny recipe runs at dp=2 with no micro-batch overrides.
"""

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.support.cli import checkpoint_tensors, read_jsonl, run_cli
from tests.support.gates import assert_reference_gates, gate_failures
from tests.support.recipes import FAST, RANDOM_START, TINY

RANK_MICRO = ["policy.train_micro_batch_size=2", "value.train_micro_batch_size=2"]
CP2 = ["policy.parallel.cp=2", "value.parallel.cp=2"]


def _args(sft_dir, name, steps, workers, *extra):
    return [
        "ppo",
        TINY,
        *FAST,
        *RANK_MICRO,
        f"sft.output_dir={sft_dir}",
        f"ppo.max_num_steps={steps}",
        "ppo.validation.period=2",
        f"cluster.workers_per_node={workers}",
        f"logger.log_dir={name}/log",
        f"checkpointing.checkpoint_dir={name}/ckpt",
        "checkpointing.save_period=2",
        "checkpointing.keep_last=5",
        *extra,
    ]


def _metrics(cwd, name, step):
    return next(r for r in read_jsonl(cwd / name / "log" / "metrics.jsonl") if r["step"] == step)


@pytest.fixture(scope="module")
def runs(sft_dir, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("multirank")
    run_cli(_args(sft_dir, "dp1", 2, 1), cwd)
    run_cli(_args(sft_dir, "dp2", 2, 2), cwd)
    run_cli(_args(sft_dir, "pools", 2, 2, "cluster.policy_ranks=1"), cwd)
    run_cli(_args(sft_dir, "cp2", 2, 2, *CP2), cwd)
    return cwd


@pytest.mark.slow  # the module fixture runs four 2-rank CLI runs; 2 ranks end to end: the last test of this file
def test_two_ranks_pass_the_reference_gates(runs):
    steps = [_metrics(runs, "dp2", step) for step in (1, 2)]
    assert_reference_gates(steps)
    assert gate_failures(steps) == []


@pytest.mark.slow  # the module fixture runs four 2-rank CLI runs; 2 ranks end to end: the last test of this file
def test_first_step_metrics_match_single_process(runs):
    one, two = _metrics(runs, "dp1", 1), _metrics(runs, "dp2", 1)
    compared = [k for k in one if not k.startswith(("timing/", "perf/")) and k != "step"]
    assert len(compared) > 20 and set(compared) <= set(two)
    for key in compared:
        assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), key


@pytest.mark.slow  # the module fixture runs four 2-rank CLI runs; 2 ranks end to end: the last test of this file
def test_separate_pools_train_exactly_like_one_process(runs, tmp_path):
    """Policy on rank 0, critic on rank 1: the same algorithm, so every step's metrics and the final
    weights equal the single-process run's; only where the work runs differs."""
    for step in (1, 2):
        one, pools = _metrics(runs, "dp1", step), _metrics(runs, "pools", step)
        for key in one:
            if not key.startswith(("timing/", "perf/")):
                assert pools[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), (step, key)
    (tmp_path / "one").mkdir(), (tmp_path / "pools").mkdir()
    single = checkpoint_tensors(runs / "dp1" / "ckpt" / "step_2", tmp_path / "one")
    pooled = checkpoint_tensors(runs / "pools" / "ckpt" / "step_2", tmp_path / "pools")
    weights = [k for k in single if k.startswith(("policy.model.", "value.model."))]
    assert any(k.startswith("value.") for k in weights) and any(k.startswith("policy.") for k in weights)
    for key in weights:
        torch.testing.assert_close(pooled[key], single[key], rtol=1e-5, atol=1e-6, msg=key)
    shard_files = sorted(p.name for p in (runs / "pools" / "ckpt" / "step_2" / "weights").glob("*.distcp"))
    assert shard_files == ["__0_0.distcp", "__1_0.distcp"]  # each pool wrote its own model


@pytest.mark.slow  # the module fixture runs four 2-rank CLI runs; 2 ranks end to end: the last test of this file
def test_cp2_trains_exactly_like_one_process(runs):
    """Both models context-parallel over the two ranks: every metric of both steps (rollouts, rewards, both
    updates, validation) equals the single-process run's, timings aside."""
    for step in (1, 2):
        one, cp2 = _metrics(runs, "dp1", step), _metrics(runs, "cp2", step)
        compared = [k for k in one if not k.startswith(("timing/", "perf/"))]
        assert len(compared) > 20 and set(compared) <= set(cp2)
        for key in compared:
            assert cp2[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), (step, key)


@pytest.mark.slow  # the module fixture runs four 2-rank CLI runs; 2 ranks end to end: the last test of this file
def test_a_cp2_checkpoint_resumes_at_cp1_and_a_cp1_checkpoint_at_cp2(runs, sft_dir):
    shutil.copytree(runs / "cp2", runs / "cp2_to_cp1")
    shutil.copytree(runs / "dp1", runs / "cp1_to_cp2")
    assert "resumed from" in run_cli(_args(sft_dir, "cp2_to_cp1", 3, 1), runs).stdout
    assert "resumed from" in run_cli(_args(sft_dir, "cp1_to_cp2", 3, 2, *CP2), runs).stdout
    at_cp1, at_cp2 = _metrics(runs, "cp2_to_cp1", 3), _metrics(runs, "cp1_to_cp2", 3)
    compared = [k for k in at_cp1 if not k.startswith(("timing/", "perf/"))]
    assert len(compared) > 20
    for key in compared:
        assert at_cp2[key] == pytest.approx(at_cp1[key], rel=1e-4, abs=1e-6), key


@pytest.mark.slow
def test_dp2_checkpoint_resumes_at_dp1_and_dp2_alike(runs, sft_dir):
    shutil.copytree(runs / "dp2", runs / "resume1")
    shutil.copytree(runs / "dp2", runs / "resume2")
    assert "resumed from" in run_cli(_args(sft_dir, "resume1", 3, 1), runs).stdout
    assert "resumed from" in run_cli(_args(sft_dir, "resume2", 3, 2), runs).stdout
    at_dp1, at_dp2 = _metrics(runs, "resume1", 3), _metrics(runs, "resume2", 3)
    for key in at_dp1:
        if not key.startswith(("timing/", "perf/")):
            assert at_dp2[key] == pytest.approx(at_dp1[key], rel=1e-4, abs=1e-6), key


@pytest.mark.slow  # the module fixture runs four 2-rank CLI runs; 2 ranks end to end: the last test of this file
def test_export_of_a_sharded_checkpoint(runs, tmp_path):
    run_cli(["export", runs / "dp2" / "ckpt", tmp_path / "hf"], runs)
    saved = checkpoint_tensors(runs / "dp2" / "ckpt" / "step_2", tmp_path)
    policy = AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / "policy")
    for name, tensor in policy.state_dict().items():
        source = "model.embed_tokens.weight" if name == "lm_head.weight" else name  # tied: stored once
        assert torch.equal(tensor, saved[f"policy.model.{source}"]), name
    two_shard_files = sorted(p.name for p in (runs / "dp2" / "ckpt" / "step_2" / "weights").glob("*.distcp"))
    assert two_shard_files == ["__0_0.distcp", "__1_0.distcp"]


def _torchrun(cwd, processes: int, ppo_args: list[str]) -> None:
    """``dtppo ppo`` under torchrun (``ppo_args`` as ``_args`` makes them, the sub-command first)."""
    import os
    import subprocess
    import sys

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    proc = subprocess.run(
        [*command, "-m", "dtppo", *ppo_args],
        cwd=cwd,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_same_entry_point_under_torchrun(runs, sft_dir):
    _torchrun(runs, 2, _args(sft_dir, "torchrun", 1, 2))
    launched, spawned = _metrics(runs, "torchrun", 1), _metrics(runs, "dp2", 1)
    for key in spawned:
        if not key.startswith(("timing/", "perf/")) and key in launched:
            assert launched[key] == pytest.approx(spawned[key], rel=1e-4, abs=1e-6), key


@pytest.mark.slow
def test_generation_ranks_under_torchrun_equal_the_spawned_ranks(runs, sft_dir):
    """torchrun starts 3 processes: two train (dp=2), the third only generates, one step ahead; the numbers are
    those of the same layout spawned by the CLI itself."""
    extra = ["cluster.generation_ranks=1", "ppo.max_lag=1", "loss.rollout_correction.importance_sampling=token"]
    run_cli(_args(sft_dir, "spawned_async", 2, 3, *extra), runs)
    _torchrun(runs, 3, _args(sft_dir, "torchrun_async", 2, 3, *extra))
    for step in (1, 2):
        launched, spawned = _metrics(runs, "torchrun_async", step), _metrics(runs, "spawned_async", step)
        assert launched["train/staleness/max"] == step - 1
        for key in spawned:
            if not key.startswith(("timing/", "perf/")):
                assert launched[key] == pytest.approx(spawned[key], rel=1e-4, abs=1e-6), key


def test_tiny_recipe_runs_on_two_ranks_without_micro_batch_overrides(tmp_path):
    """The recipe's micro-batch (32) is more than a rank's share of FAST's global batch at dp=2 (4 of 8): it is
    clamped to the share, rank 0 says so once per model, and the step runs."""
    fast = [a for a in FAST if "micro_batch_size" not in a]
    proc = run_cli(
        [
            "ppo",
            TINY,
            *fast,
            *RANDOM_START,
            "ppo.max_num_steps=1",
            "ppo.validation.at_start=false",
            "cluster.workers_per_node=2",
            "logger.log_dir=log",
            "checkpointing.enabled=false",
        ],
        tmp_path,
    )
    assert proc.stdout.count("per-rank sizes clamped") == 2, proc.stdout
    assert (
        "policy: per-rank sizes clamped to a rank's share over 2 data-parallel ranks: "
        "train_micro_batch_size 32 -> 4, logprob_batch_size 64 -> 8" in proc.stdout
    )
    trained = [r for r in read_jsonl(tmp_path / "log" / "metrics.jsonl") if "train/loss" in r]
    assert [r["step"] for r in trained] == [1] and trained[0]["train/critic/loss"] >= 0
