#!/usr/bin/env bash
# The GPU check (bench/device/check.py): phases under one deadline, the JSON rewritten after each phase, a phase's
# error recorded without stopping the next. Without CUDA, or with --cpu, a CPU smoke test of the same code.
# Extra arguments go to check.py (--phases, --deadline, --out, sizes).
#
#   bash bench/device/gpu.sh                    # writes bench/results/device/gpu.json
#   bash bench/device/gpu.sh --cpu --out /tmp/gpu.json
#
# Works from a checkout without installing dtppo (src/ goes on PYTHONPATH); needs torch, transformers, pyyaml and
# math-verify (every `dtppo ppo` imports it), and peft for the LoRA phases. A machine without a package index gets
# math-verify and what it pulls from .whl/ (`make device-wheels` fills it; git ignores it; a device call carries it),
# installed here into a temporary folder. No network use.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
SITE=""
if compgen -G "$ROOT/.whl/*.whl" > /dev/null; then
  SITE="$(mktemp -d)"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$ROOT"/.whl/*.whl
fi
export PYTHONPATH="$ROOT/src:$ROOT${SITE:+:$SITE}${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" -c "import math_verify" 2> /dev/null \
  || echo "gpu.sh: math-verify does not import: every dtppo ppo phase will fail (make device-wheels, carry .whl)"
export DTPPO_GPU_COMMAND="bash bench/device/gpu.sh${*:+ $*}"
exec "$PYTHON" -m bench.device.check "$@"
