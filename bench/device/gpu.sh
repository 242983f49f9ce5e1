#!/usr/bin/env bash
# One prepared GPU check (see bench/device/check.py): the tiny recipe's numerics on CUDA against CPU fp32, then one
# PPO step of a Qwen2.5-0.5B-shaped model (tokens/s and fraction of the bf16 matmul peak measured in the run), its
# updates profiled, and decode eager vs compiled graphs vs transformers.generate.
# Without CUDA, or with --cpu, a few-second CPU smoke test of the same code. Extra arguments go to check.py.
#
#   bash bench/device/gpu.sh                    # writes bench/results/device/gpu.json
#   bash bench/device/gpu.sh --cpu --out /tmp/gpu.json
#
# Works from a checkout without installing dtppo (src/ goes on PYTHONPATH); needs torch, transformers and
# pyyaml, and math-verify for the reward phase (skipped and recorded as such without it). No network use.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
export PYTHONPATH="$ROOT/src:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export DTPPO_GPU_COMMAND="bash bench/device/gpu.sh${*:+ $*}"
exec "$PYTHON" -m bench.device.check "$@"
