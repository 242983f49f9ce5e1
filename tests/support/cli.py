"""Running the CLI as the end-to-end tests do, and reading what a run wrote."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


def run_cli(args, cwd, timeout=900, check=True, env=None):
    """``dtppo ARGS`` in a subprocess in ``cwd``; ``env``: variables added to this process's environment."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.run(
        [sys.executable, "-m", "dtppo", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"dtppo {' '.join(map(str, args))} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


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
