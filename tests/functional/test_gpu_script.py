"""bench/device/gpu.sh in its CPU-fallback mode: the same code as the CUDA check, in fp32 at tiny sizes, in seconds.

The CUDA path itself needs a GPU; this keeps the script runnable and its JSON well-formed on every machine, and
checks that the step it times is the real trainer's (its `timing/*` phases) and that the fallback never writes
under the GPU result's name.
"""

import json
import math
import os
import subprocess
import sys

import pytest

from tests.support.recipes import REPO

STEP_FIELDS = [
    "tokens_per_s",
    "generated_tokens_per_s",
    "model_flops_per_step_estimate",
    "achieved_tflops",
    "peak_tflops",
    "peak_fraction",
    "tokens_per_step",
]
CHECK_FIELDS = [
    "logprob_max_abs_diff",
    "logprob_mean_abs_diff",
    "value_max_abs_diff",
    "policy_loss_diff",
    "critic_loss_diff",
    "policy_grad_norm_rel_diff",
    "critic_grad_norm_rel_diff",
]
# PPOTrainer.step's named phases, as the trainer itself reports them.
PHASES = {
    "prompts",
    "generation",
    "reward",
    "value_inference",
    "policy_logprobs",
    "advantages",
    "critic_update",
    "policy_update",
    "share_metrics",
    "step",
}


# Slow (46 s): it checks the device script, not dtppo, whose code it runs is tested on its own; run it (`make
# test-all`, or `pytest -m slow tests/functional/test_gpu_script.py`) before a device session.
@pytest.mark.slow
def test_gpu_script_cpu_fallback(tmp_path):
    out = tmp_path / "gpu.json"
    env = dict(os.environ, PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        ["bash", str(REPO / "bench" / "device" / "gpu.sh"), "--cpu", "--out", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["mode"] == "cpu-fallback" and result["command"].startswith("bash bench/device/gpu.sh")
    assert result["numerics_passed"] is True and result["numerics"]
    for check in result["numerics"]:
        assert check["passed"] is True
        for field in CHECK_FIELDS:
            assert math.isfinite(check[field]) and field in check["tolerances"]
    step = result["step"]  # `dtppo ppo` itself: one warm-up step, then the measured one
    assert step["passed"] is True and step["exit_code"] == 0 and step["steps_measured"] == 1
    for field in STEP_FIELDS:
        assert math.isfinite(step[field]) and step[field] > 0, field
    assert 0 < step["peak_fraction"] < 1.5  # a fraction of a peak measured in the same run (noise allows a little)
    assert {k.removeprefix("timing/") for k in step["timing_s_median"]} >= PHASES
    assert all(math.isfinite(s) and s >= 0 for s in step["timing_s_median"].values())
    assert 0.0 <= step["last_step"]["train/reward"] <= 1.0
    assert result["step_vllm"] == {"skipped": "CPU fallback"}
    # issue 22, part 2: measured on the device only (offload saves nothing where the device is host memory)
    assert result["memory_features"] == result["features_smoke"] == {"skipped": "CPU fallback"}
    resume = result["checkpoint_resume"]
    assert resume["passed"] is True and resume["resumed"] is True and resume["steps_logged"] == [1, 2, 3]
    # issue 23: the updates' profiles (CPU time in the fallback) and the decode bench (eager only on CPU)
    assert math.isfinite(step["critic_over_policy_update"]) and step["critic_over_policy_update"] > 0
    profile = result["update_profile"]
    assert profile["passed"] is True and set(profile["profiles"]) == {"policy", "value"}
    for summary in profile["profiles"].values():
        assert summary["ranked_by"] == "self_cpu_ms" and summary["total_self_cpu_ms"] > 0
        times = [op["self_cpu_ms"] for op in summary["top"]]
        assert times == sorted(times, reverse=True) and "aten::mm" in {op["name"] for op in summary["top"]}
    assert profile["critic_over_policy_self_time"] > 0
    table = result["throughput_table"]  # the smoke shape, from a model directory with a 512-entry vocabulary
    assert table["passed"] is True and [r["shape"] for r in table["rows"]] == ["smoke"]
    (row,) = table["rows"]
    assert row["vocab_size"] == 512 and any(o.startswith("policy.model.path=") for o in row["overrides"])
    assert all(0 < f < 1.5 for f in row["update_peak_fraction"].values()) and len(row["update_peak_fraction"]) == 2
    assert 0.9 < sum(row["phase_share"].values()) < 1.01  # the phases make up the step
    assert row["max_memory_allocated_gib"] is None  # CUDA only
    decode = result["decode"]
    assert set(decode["variants"]) == {"dtppo eager"} and decode["variants"]["dtppo eager"]["tokens_per_s"] > 0
    # the README's one-GPU quickstart recipe, on the smoke shape: it runs, checkpoints and exports where it says
    quick = result["quickstart"]
    assert quick["passed"] is True and quick["exit_codes"] == [0, 0], quick["stderr_tail"]
    assert quick["recipe"] == "recipes/qwen2.5-0.5b-gsm8k-1gpu.yaml" and quick["checkpoints"] == ["step_2"]
    assert {"policy", "critic"} <= set(quick["exported"]) and len(quick["step_seconds"]) == 2
    # issue 46: the long-response passes (8k and 16k tokens at the 0.5B shape on CUDA; 256 tokens here)
    long = result["long_responses"]
    assert long["passed"] is True and [(r["what"], r["T"]) for r in long["rows"]] == [
        ("critic", 256), ("policy", 256), ("logprobs", 256)
    ]  # fmt: skip
    assert all(r["seconds"] > 0 and r["peak_mib"] >= 0 for r in long["rows"])
    # what autograd keeps for backward: the training passes' activations, nothing for the no-grad recompute
    assert [r["saved_mib"] > 0 for r in long["rows"]] == [True, True, False]


def test_cpu_fallback_never_writes_the_gpu_result(tmp_path):
    """Without --out a CPU run goes to runs/, so a smoke test cannot land as bench/results/device/gpu.json."""
    source = (REPO / "bench" / "device" / "check.py").read_text()
    assert '"runs" / "gpu-check-cpu.json"' in source and "if cuda else" in source
