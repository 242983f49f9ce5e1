"""Storage faults in process: a full disk during each stage of a write, damaged files on load, leftovers
of a kill. (Unwritable directories and real kernel write errors are exercised through the CLI in
tests/functional/test_storage_faults.py.)

A full disk is simulated by wrapping ``io.open`` (which ``Path.open`` and torch.distributed.checkpoint's
file system use): files opened for writing under the checkpoint directory raise OSError(ENOSPC) once a byte
budget is spent, as a full device does.
"""

import errno
import io
import os

import pytest
import torch

from dtppo.checkpoint import store as checkpoint
from dtppo.errors import CheckpointError


def _state(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "policy": {
            "model": {"w": torch.randn(64, 64, generator=g), "b": torch.randn(64, generator=g)},
            "optim": {"state": {"w": {"exp_avg": torch.randn(64, 64, generator=g)}}},
        }
    }


def _empty_like(state):
    return {k: _empty_like(v) if isinstance(v, dict) else torch.zeros_like(v) for k, v in state.items()}


def _save(root, step, seed=None):
    return checkpoint.save(
        root, step, _state(step if seed is None else seed), {"steps_done": step}, {"ppo": {"seed": 0}}, keep_last=5
    )


def _assert_loads_as(step_dir, seed, steps_done):
    target = _empty_like(_state(seed))
    replicated, config = checkpoint.load(step_dir, target)
    assert replicated["steps_done"] == steps_done and config == {"ppo": {"seed": 0}}
    expected = _state(seed)
    for key in ("w", "b"):
        assert torch.equal(target["policy"]["model"][key], expected["policy"]["model"][key])


@pytest.fixture
def full_disk(monkeypatch):
    """``full_disk(root, budget)``: writes under ``root`` fail with ENOSPC after ``budget`` bytes in total."""
    real_open = io.open

    def install(root, budget):
        left = [budget]

        class FullFile:
            def __init__(self, fh):
                self._fh = fh

            def write(self, data):
                size = memoryview(data).nbytes
                if size > left[0]:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._fh.name)
                left[0] -= size
                return self._fh.write(data)

            def __getattr__(self, name):
                return getattr(self._fh, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self._fh.close()

        def fake_open(file, mode="r", *args, **kwargs):
            fh = real_open(file, mode, *args, **kwargs)
            writing = any(flag in mode for flag in "wax+")
            return FullFile(fh) if writing and str(file).startswith(str(root)) else fh

        monkeypatch.setattr(io, "open", fake_open)

    return install


def _weights_bytes(step_dir):
    return sum(p.stat().st_size for p in (step_dir / checkpoint.WEIGHTS_DIR).iterdir())


@pytest.mark.parametrize("stage", ["weights", "trainer_state"])
def test_full_disk_fails_clearly_and_keeps_the_previous_checkpoint(tmp_path, full_disk, stage):
    root = tmp_path / "ckpt"
    first = _save(root, 1)
    before = {p: p.read_bytes() for p in first.rglob("*") if p.is_file()}
    # A budget of 0 fails the first shard; one that holds exactly the weights fails trainer.pt after them.
    full_disk(root, 0 if stage == "weights" else _weights_bytes(first))
    with pytest.raises(CheckpointError) as err:
        _save(root, 2)
    message = str(err.value)
    assert f"cannot write checkpoint {root / 'step_2'}" in message and "step_1 is intact" in message
    assert "\n" not in message and "MiB free there" in message
    assert "No space left on device" in message
    assert ("(weights)" in message and "__0_0.distcp" in message) if stage == "weights" else "trainer.pt" in message
    assert sorted(p.name for p in root.iterdir()) == ["step_1"]  # no step_2, partial tmp_step_2 removed
    assert {p: p.read_bytes() for p in first.rglob("*") if p.is_file()} == before
    _assert_loads_as(first, seed=1, steps_done=1)


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garble(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, target, expected",
    [
        (_truncate, "weights/__0_0.distcp", r"weights/__0_0\.distcp has \d+ bytes, expected \d+ \(truncated"),
        (_garble, "weights/__0_0.distcp", r"weights/__0_0\.distcp fails its CRC32 check \(garbled\)"),
        (_truncate, "trainer.pt", r"trainer\.pt has \d+ bytes, expected \d+ \(truncated"),
        (_garble, "trainer.pt", r"trainer\.pt fails its CRC32 check"),
        (_garble, "weights/.metadata", r"weights/\.metadata fails its CRC32 check"),
        (os.remove, "config.yaml", r"is incomplete: .*step_1/config\.yaml is missing"),
        (os.remove, "trainer.pt", r"is incomplete: .*step_1/trainer\.pt is missing"),
        (os.remove, "manifest.json", r"is incomplete: .*step_1/manifest\.json is missing"),
        (_truncate, "manifest.json", r"is corrupted: .*step_1/manifest\.json is unreadable"),
    ],
)
def test_damaged_checkpoint_is_detected_on_load_naming_the_file(tmp_path, damage, target, expected):
    step_dir = _save(tmp_path, 1)
    damage(step_dir / target)
    with pytest.raises(CheckpointError, match=expected):
        checkpoint.load(step_dir, _empty_like(_state(1)))


def test_every_file_of_a_checkpoint_is_in_its_manifest(tmp_path):
    step_dir = _save(tmp_path, 3)
    files = {str(p.relative_to(step_dir)) for p in step_dir.rglob("*") if p.is_file()}
    import json

    listed = set(json.loads((step_dir / checkpoint.MANIFEST_FILE).read_text())["files"])
    assert listed == files - {checkpoint.MANIFEST_FILE}
    assert {"trainer.pt", "config.yaml", "weights/.metadata", "weights/__0_0.distcp"} <= listed


def test_leftovers_of_a_kill_are_ignored_then_removed(tmp_path):
    _save(tmp_path, 1)
    # What a kill can leave: a half-written next step, and an old step half-way through being pruned.
    (tmp_path / "tmp_step_2" / "weights").mkdir(parents=True)
    (tmp_path / "tmp_step_2" / "weights" / "__0_0.distcp").write_bytes(b"partial")
    (tmp_path / "tmp_discard_step_0" / "weights").mkdir(parents=True)
    assert checkpoint.complete_steps(tmp_path) == [1] and checkpoint.latest_step(tmp_path) == 1
    _save(tmp_path, 2, seed=7)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1", "step_2"]
    _assert_loads_as(tmp_path / "step_2", seed=7, steps_done=2)


def test_pruning_and_rewriting_a_step_leave_only_whole_steps(tmp_path):
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, step, _state(step), {"steps_done": step}, {"ppo": {"seed": 0}}, keep_last=2)
    checkpoint.save(tmp_path, 3, _state(9), {"steps_done": 3}, {"ppo": {"seed": 0}}, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2", "step_3"]
    _assert_loads_as(tmp_path / "step_3", seed=9, steps_done=3)
    _assert_loads_as(tmp_path / "step_2", seed=2, steps_done=2)
