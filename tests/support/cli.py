"""Running the CLI as the end-to-end tests do, and reading what a run wrote."""

import atexit
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.cli_server import IMPORT_TIME_ENV
from tests.support.recipes import REPO


def run_cli(args, cwd, timeout=900, check=True, env=None) -> subprocess.CompletedProcess:
    """``dtppo ARGS`` as a user runs it, in ``cwd``; ``env``: variables added to this process's environment. Returns
    the exit code and what the command wrote on stdout and stderr; raises ``subprocess.TimeoutExpired`` past
    ``timeout`` seconds.

    The command runs in a child forked from a server that has imported the stack once (tests/support/cli_server.py):
    the same ``dtppo.cli.main`` with the same argv, working directory, environment, exit code and output as
    ``python -m dtppo``, without the ~6 s of start-up per command. A command whose environment changes what the stack
    reads at import (``cli_server.IMPORT_TIME_ENV``), or any command when ``DTPPO_TEST_CLI=subprocess``, runs in a
    fresh interpreter instead."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    argv = [str(a) for a in args]
    if _forks(env):
        proc = _SERVER.run(argv, cwd, env, timeout)
    else:
        proc = subprocess.run(
            [sys.executable, "-m", "dtppo", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
    if check and proc.returncode != 0:
        raise AssertionError(f"dtppo {' '.join(argv)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def _forks(env: dict[str, str]) -> bool:
    """Whether a command with ``env`` can run in a forked child: nothing it sets is read at import time."""
    if env.get("DTPPO_TEST_CLI") == "subprocess":  # env holds this process's environment too
        return False
    return all(env.get(name) == os.environ.get(name) for name in IMPORT_TIME_ENV)


class _CliServer:
    """This process's connection to tests/support/cli_server.py, started at the first command and ended with the
    process. One command at a time (the tests run serially)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None

    def run(self, argv: list[str], cwd, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"argv": argv, "cwd": str(cwd), "env": env, "timeout": timeout}
            answer = self._ask(request | {"stdout": str(out), "stderr": str(err)})
            shown = [sys.executable, "-m", "dtppo", *argv]
            stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
            if answer.get("timeout"):
                raise subprocess.TimeoutExpired(shown, timeout, stdout, stderr)
            return subprocess.CompletedProcess(shown, answer["returncode"], stdout, stderr)

    def _ask(self, request: dict) -> dict:
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.cli_server"],
                cwd=REPO,
                env=dict(os.environ, PYTHONPATH=str(REPO)),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            atexit.register(self.process.kill)
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the CLI server (tests/support/cli_server.py) exited {self.process.wait()}")
        return json.loads(line)


_SERVER = _CliServer()


def run_cli_in_process(args, cwd, monkeypatch, capsys) -> tuple[int, str, str]:
    """``dtppo ARGS`` through ``dtppo.cli.main`` in this process, for failures found before any rank starts:
    the same code path as the console command, without the ~5 s of interpreter and import start-up per call.
    Returns (exit code, stdout, stderr)."""
    from dtppo.cli import main

    monkeypatch.chdir(cwd)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return stopped.value.code, out, err


def checkpoint_tensors(step_dir, tmp_path=None):
    """Every tensor of a step checkpoint's weights (model and optimizer, any layout), flattened to
    {"policy.model.x": tensor}. The weights are converted to one torch.save file in ``tmp_path`` (kept there), or
    without it in a temporary directory."""
    if tmp_path is None:
        with tempfile.TemporaryDirectory() as tmp:
            return checkpoint_tensors(step_dir, tmp)
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = Path(tmp_path) / f"{Path(step_dir).parent.name}_{Path(step_dir).name}.pt"
    dcp_to_torch_save(Path(step_dir) / "weights", out)
    flat = {}

    def walk(prefix, node):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(node, torch.Tensor):
            flat[prefix] = node

    walk("", torch.load(out, weights_only=False))
    return flat


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
