"""Loading a checkpoint never unpickles arbitrary objects: trainer.pt holds only tensors and plain data, and
anything else in it is refused before it can run. The replicated state (RNG states included) still round-trips
exactly."""

import json
import pickle
import random

import numpy as np
import pytest
import torch

from dtppo.checkpoint import store as checkpoint
from dtppo.errors import CheckpointError


class _Payload:
    """Unpickling this calls ``open(marker, "w")``: it creates ``marker``, the evidence that code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _weights():
    return {"policy": {"model": {"w": torch.arange(6.0).reshape(2, 3)}}}


def _rewrite_manifest(step_dir):
    """Re-record every file's size and CRC32, as a crafted checkpoint would: the manifest is not a defence."""
    manifest = step_dir / checkpoint.MANIFEST_FILE
    files = json.loads(manifest.read_text())["files"]
    manifest.write_text(json.dumps({"files": {name: checkpoint._digest(step_dir / name) for name in files}}))


def test_a_pickled_object_in_trainer_state_is_refused_and_never_runs(tmp_path):
    step_dir = checkpoint.save(tmp_path / "ckpt", 1, _weights(), {"steps_done": 1}, {"ppo": {"seed": 0}}, 2)
    marker = tmp_path / "payload_ran"
    torch.save({"steps_done": 1, "loader": _Payload(marker)}, step_dir / checkpoint.TRAINER_FILE)
    _rewrite_manifest(step_dir)
    checkpoint.verify(step_dir)  # the file is "intact": only its content is hostile

    with pytest.raises(CheckpointError) as info:
        checkpoint.load(step_dir, {"policy": {"model": {"w": torch.zeros(2, 3)}}})
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert "trainer.pt" in message and f"{open.__module__}.open" in message and "refus" in message
    assert not marker.exists()


def test_trainer_state_is_plain_data_and_rng_states_round_trip(tmp_path):
    torch.manual_seed(11), random.seed(12), np.random.seed(13)
    np.random.standard_normal()  # leaves a cached Gaussian in numpy's state
    state = {"rng": checkpoint.rng_state(), "loader": {"epoch": 1, "offset": 7}, "steps_done": 3}
    step_dir = checkpoint.save(tmp_path / "ckpt", 3, _weights(), state, {"ppo": {"seed": 0}}, 2)
    expected = (torch.rand(4), [random.random() for _ in range(4)], np.random.standard_normal(4))

    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    # loadable by torch's restricted unpickler alone: no custom classes, no numpy objects
    torch.load(step_dir / checkpoint.TRAINER_FILE, weights_only=True)
    replicated, _ = checkpoint.load(step_dir, {"policy": {"model": {"w": torch.zeros(2, 3)}}})
    checkpoint.set_rng_state(replicated["rng"])
    # written in the layout before 2026-12-07 (the loader beside the rollouts): read in today's
    assert replicated["rollouts"] == {"loader": {"epoch": 1, "offset": 7}, "step": 3} and replicated["steps_done"] == 3
    assert torch.equal(torch.rand(4), expected[0])
    assert [random.random() for _ in range(4)] == expected[1]
    assert np.array_equal(np.random.standard_normal(4), expected[2])


def test_a_pickled_object_in_the_weights_metadata_is_refused_and_never_runs(tmp_path):
    step_dir = checkpoint.save(tmp_path / "ckpt", 1, _weights(), {"steps_done": 1}, {"ppo": {"seed": 0}}, 2)
    marker = tmp_path / "payload_ran"
    (step_dir / "weights" / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    _rewrite_manifest(step_dir)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(step_dir, {"policy": {"model": {"w": torch.zeros(2, 3)}}})
    message = str(info.value)
    assert len(message.splitlines()) == 1 and ".metadata" in message and "refus" in message, message
    assert not marker.exists()


def test_a_pickled_object_among_the_weights_non_tensor_entries_is_refused_and_never_runs(tmp_path):
    # DCP stores non-tensor entries (optimizer hyper-parameters) as pickles inside its shard files.
    marker = tmp_path / "payload_ran"
    state = {"policy": {"model": {"w": torch.ones(2, 3)}, "optim": {"param_groups": [{"lr": 0.1}]}}}
    step_dir = checkpoint.save(tmp_path / "ckpt", 1, state, {"steps_done": 1}, {"ppo": {"seed": 0}}, 2)
    hostile = {"policy": {"model": {"w": torch.ones(2, 3)}, "optim": {"param_groups": [{"lr": _Payload(marker)}]}}}
    checkpoint.save(tmp_path / "hostile", 1, hostile, {"steps_done": 1}, {"ppo": {"seed": 0}}, 2)
    target = {"policy": {"model": {"w": torch.zeros(2, 3)}, "optim": {"param_groups": [{"lr": 0.0}]}}}
    checkpoint.load(step_dir, target)  # plain data loads
    assert target["policy"]["optim"]["param_groups"][0]["lr"] == 0.1 and torch.equal(
        target["policy"]["model"]["w"], torch.ones(2, 3)
    )
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(tmp_path / "hostile" / "step_1", target)
    message = str(info.value)
    assert len(message.splitlines()) == 1 and "weights" in message and "refus" in message, message
    assert not marker.exists()
