"""bench/gpu.sh in its CPU-fallback mode: the same code as the CUDA check, in fp32 at tiny sizes, in seconds.

The CUDA path itself needs a GPU; this keeps the script runnable and its JSON well-formed on every machine.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

STEP_FIELDS = ["step_s_median", "tokens_per_s", "generated_tokens_per_s", "model_flops_per_step", "achieved_tflops",
               "peak_tflops", "peak_fraction", "tokens_per_step"]
CHECK_FIELDS = ["logprob_max_abs_diff", "logprob_mean_abs_diff", "value_max_abs_diff", "policy_loss_rel_diff",
                "critic_loss_rel_diff", "policy_grad_norm_rel_diff", "critic_grad_norm_rel_diff"]
PHASES = ["generation", "reward", "value_inference", "policy_logprobs", "advantages", "critic_update",
          "policy_update"]


def test_gpu_script_cpu_fallback(tmp_path):
    out = tmp_path / "gpu.json"
    env = dict(os.environ, PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu.sh"), "--cpu", "--out", str(out)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["mode"] == "cpu-fallback" and result["command"].startswith("bash bench/gpu.sh")
    assert result["numerics_passed"] is True and result["numerics"]
    for check in result["numerics"]:
        assert check["passed"] is True
        for field in CHECK_FIELDS:
            assert math.isfinite(check[field]) and field in check["tolerances"]
    step = result["step"]
    assert step["precision"] == "fp32" and step["steps_measured"] >= 1
    for field in STEP_FIELDS:
        assert math.isfinite(step[field]) and step[field] > 0, field
    assert 0 < step["peak_fraction"] < 1.5  # a fraction of a peak measured in the same run (noise allows a little)
    assert set(step["phases_s_median"]) == set(PHASES)
    assert all(math.isfinite(s) and s >= 0 for s in step["phases_s_median"].values())
    trainer = result["trainer"]  # the real CLI and workers, 2 PPO steps (on the GPU in CUDA mode)
    assert trainer["exit_code"] == 0 and trainer["steps_logged"] == 2 and trainer["passed"] is True
    assert 0.0 <= trainer["last_step_metrics"]["train/reward"] <= 1.0
