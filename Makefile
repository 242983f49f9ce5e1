# `make demo` and `make test` work from a fresh clone with only Python 3.11: they build .venv first.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test venv clean

venv: $(STAMP)

# torch first and explicitly: a bare `torch` requirement would pull the multi-GB CUDA build.
$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c requirements.lock -r requirements.lock
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/dtppo ppo recipes/tiny-math-cpu.yaml

test: $(STAMP)
	$(PY) -m pytest -q tests

clean:
	rm -rf runs
