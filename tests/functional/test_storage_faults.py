"""Storage faults through the CLI, with real kernel errors: a checkpoint directory the run may not write
(mode 0555; when the tests run as root, the run is started without CAP_DAC_OVERRIDE so the mode bits
apply), a file-size limit (RLIMIT_FSIZE: the weights shard cannot be written, as on a full device), and a
truncated weights shard on resume. Each exits 4 with one line naming the path and leaves step_2 as it was.
(ENOSPC itself, at each stage of a write, is simulated in process: tests/unit/checkpoint/test_store_faults.py.)"""

import ctypes
import os
import resource
import shutil
import signal
import subprocess
import sys

import pytest

from tests.support.cli import run_cli
from tests.support.killing import RunSpec  # the tiny run spec the kill tests use

PR_CAPBSET_DROP, CAP_DAC_OVERRIDE = 24, 1


def _launch(cwd, name, steps, preexec_fn=None):
    """The tiny kill-test run in ``cwd``; with ``preexec_fn`` (a limit the command starts under) in a process of its
    own, else as the CLI tests run it (``run_cli``)."""
    if preexec_fn is None:
        return run_cli(RunSpec(steps=steps).args(name), cwd, check=False)
    return subprocess.run(
        [sys.executable, "-m", "dtppo", *RunSpec(steps=steps).args(name)],
        cwd=cwd,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        capture_output=True,
        text=True,
        timeout=900,
        preexec_fn=preexec_fn,
    )


def _files(step_dir):
    return {p.relative_to(step_dir): p.read_bytes() for p in sorted(step_dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """Two steps, checkpointed at 1 and 2."""
    cwd = tmp_path_factory.mktemp("storage")
    proc = _launch(cwd, "base", 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (cwd / "base/ckpt").iterdir()) == ["step_1", "step_2"]
    return cwd


def _copy(base, name):
    shutil.copytree(base / "base", base / name)
    return base / name / "ckpt"


def _error_line(proc):
    lines = [line for line in proc.stderr.splitlines() if line.startswith("dtppo: error")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


def _without_dac_override():
    """preexec_fn: as root, drop CAP_DAC_OVERRIDE from the bounding set, so after exec the run has no
    capability to ignore a directory's mode bits (a no-op for an ordinary user, whom they bind anyway)."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE)")


def _file_size_limit():
    """preexec_fn: files may not grow past 1 MiB (the weights shard is ~2.2 MiB); the write fails with EFBIG
    instead of killing the process with SIGXFSZ, the way a full device fails it with ENOSPC."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


def test_unwritable_checkpoint_directory(base):
    ckpt = _copy(base, "readonly")
    before = _files(ckpt / "step_2")
    ckpt.chmod(0o555)
    try:
        proc = _launch(base, "readonly", 3, preexec_fn=_without_dac_override)
    finally:
        ckpt.chmod(0o755)
    assert proc.returncode == 4, proc.stderr[-3000:]
    line = _error_line(proc)
    assert line.startswith(f"dtppo: error: cannot write checkpoint {ckpt.resolve()}/step_3: PermissionError")
    assert "Permission denied" in line and line.endswith("step_2 is intact")
    assert "resumed from" in proc.stdout and sorted(p.name for p in ckpt.iterdir()) == ["step_1", "step_2"]
    assert _files(ckpt / "step_2") == before


def test_write_refused_by_the_device_mid_checkpoint(base):
    ckpt = _copy(base, "full")
    before = _files(ckpt / "step_2")
    proc = _launch(base, "full", 3, preexec_fn=_file_size_limit)
    assert proc.returncode == 4, proc.stderr[-3000:]
    line = _error_line(proc)
    assert line.startswith(f"dtppo: error: cannot write checkpoint {ckpt.resolve()}/step_3 (weights): ")
    # torch.save's writer reports EFBIG either as itself or as a short write, depending on where it hits
    assert "File too large" in line or "short write, the device is full or refuses the file size" in line
    assert line.endswith("step_2 is intact")
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_1", "step_2"]  # the partial tmp_step_3 is gone
    assert _files(ckpt / "step_2") == before


def test_truncated_weights_shard_is_reported_on_resume(base):
    ckpt = _copy(base, "truncated")
    shard = ckpt / "step_2/weights/__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])
    proc = _launch(base, "truncated", 3)
    assert proc.returncode == 4, proc.stderr[-3000:]
    expected = (base / "base/ckpt/step_2/weights/__0_0.distcp").stat().st_size
    assert _error_line(proc) == (
        f"dtppo: error: checkpoint {ckpt.resolve()}/step_2 is corrupted: "
        f"{shard.resolve()} has 1000 bytes, expected {expected} (truncated or overwritten); "
        f"step_1 is also there: move step_2 aside to resume from it"
    )
