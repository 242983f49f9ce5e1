"""vLLM engines on the right GPU under an SPMD launcher, on 2 gloo ranks with CUDA stood in for.

vLLM's default executor puts its worker on cuda:0 and makes cuda:0 the current device in every rank (vLLM 0.32,
``UniProcExecutor._distributed_args`` and ``Worker.init_device``); FSDP2 then shards every rank's model onto GPU 0.
The stub ``vllm`` below does what those two do, by executor: the external launcher takes ``LOCAL_RANK``. Each rank
records the engine's arguments, the GPU its worker took and the current device after the build.
"""

import json
import os
import sys
import tempfile
import types
from pathlib import Path

import pytest
import torch

from dtppo.config import TinyModelConfig
from dtppo.distributed.ranks import run_ranks
from dtppo.generation.vllm_engine import VLLMEngine, executor_backend
from dtppo.models.causal_lm import build_causal_lm

TINY = TinyModelConfig(
    hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64, max_position_embeddings=64
)


class FakeCuda:
    """torch.cuda's current device, for a machine without one."""

    def __init__(self) -> None:
        self.current = 0

    def set_device(self, device) -> None:
        self.current = torch.device(device).index if not isinstance(device, int) else device

    def current_device(self) -> int:
        return self.current


def _stub_vllm(cuda: FakeCuda, ignores_launcher: bool) -> dict:
    """A ``vllm`` module whose ``LLM`` records its arguments and takes its GPU as vLLM's executors do (or, for the
    negative control, always cuda:0)."""
    built = {}

    class LLM:
        def __init__(self, **kwargs):
            external = kwargs.get("distributed_executor_backend") == "external_launcher" and not ignores_launcher
            worker = int(os.environ["LOCAL_RANK"]) if external else 0
            cuda.set_device(worker)  # the worker's init_device
            built.update(kwargs=kwargs, worker_device=worker)

    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_sleep_mode_available=lambda: True)
    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.platforms = LLM, platforms
    sys.modules["vllm"], sys.modules["vllm.platforms"] = vllm, platforms
    return built


def _build(ignores_launcher: bool) -> dict:
    rank = torch.distributed.get_rank()
    cuda = FakeCuda()
    torch.cuda.set_device, torch.cuda.current_device = cuda.set_device, cuda.current_device
    built = _stub_vllm(cuda, ignores_launcher)
    cuda.set_device(rank)  # what dtppo's launcher does before the group exists
    model = build_causal_lm(None, TINY, 40, pad_id=0, eos_id=1, seed=0)
    record = {"rank": rank}
    try:
        VLLMEngine(model, (1,), 0, max_model_len=64, kv_cache_mib=8, seed=0, device=torch.device("cuda", rank))
    except RuntimeError as error:
        record["error"] = str(error)
    record |= {
        "backend": built["kwargs"].get("distributed_executor_backend"),
        "worker_device": built["worker_device"],
        "current_after": cuda.current_device(),
    }
    return record


def _ranks(out_dir: str) -> None:
    rank = torch.distributed.get_rank()
    records = {"launcher": _build(ignores_launcher=False), "control": _build(ignores_launcher=True)}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(records))


def test_each_rank_engine_takes_its_own_gpu_and_leaves_the_current_device():
    with tempfile.TemporaryDirectory() as out:
        run_ranks(_ranks, 2, out)
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(2)]
    for rank, records in enumerate(ranks):
        launcher = records["launcher"]
        assert launcher == {"rank": rank, "backend": "external_launcher", "worker_device": rank, "current_after": rank}
    # Negative control: an executor that takes cuda:0 whatever it is told (vLLM's default) is caught on rank 1
    # in one line, before FSDP2 could shard onto the wrong GPU; rank 0's engine is where it belongs.
    assert "error" not in ranks[0]["control"] and ranks[0]["control"]["current_after"] == 0
    assert "moved this rank's current CUDA device from cuda:1 to cuda:0" in ranks[1]["control"]["error"]


def test_the_default_executor_off_a_gpu_group_and_a_mismatched_local_rank_refused(monkeypatch):
    assert executor_backend(torch.device("cpu")) is None  # CPU: vLLM's own choice, as tests/vllm run it
    assert executor_backend(torch.device("cuda", 0)) is None  # one process without a group: the uni executor
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert executor_backend(torch.device("cuda", 1)) == "external_launcher"
    with pytest.raises(RuntimeError, match="trains on cuda:0 but LOCAL_RANK is 1"):
        executor_backend(torch.device("cuda", 0))
