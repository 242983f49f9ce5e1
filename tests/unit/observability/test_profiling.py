"""dtppo.observability.profiling: with DTPPO_PROFILE_DIR set, an Updater.train call writes its operators
ranked by self time; unset, nothing is written."""

import json

import torch

from dtppo.config import OptimizerConfig, SchedulerConfig
from dtppo.observability.profiling import PROFILE_ENV, PROFILE_FROM_ENV
from dtppo.ops import masked_sum
from dtppo.types import Experience
from dtppo.workers.updater import Updater


def _train_once(engine: Updater, model: torch.nn.Linear) -> None:
    exp = Experience(
        input_ids=torch.zeros(4, 3, dtype=torch.long),
        attention_mask=torch.ones(4, 3, dtype=torch.long),
        response_mask=torch.ones(4, 3),
        gen_logprobs=torch.zeros(4, 3),
        truncated=torch.zeros(4, dtype=torch.bool),
    )

    def loss(micro):
        features = micro.response_mask[..., None].expand(-1, -1, 8)
        return masked_sum(model(features).sum(-1), micro.response_mask), {}

    engine.train(exp, loss, global_batch=4, micro_batch=2)


def test_a_profiled_update_writes_its_operators(tmp_path, monkeypatch):
    model = torch.nn.Linear(8, 8, bias=False)
    engine = Updater(model, OptimizerConfig(), SchedulerConfig(), 1.0, name="value")
    _train_once(engine, model)
    assert not list(tmp_path.iterdir())  # unset: nothing profiled
    monkeypatch.setenv(PROFILE_ENV, str(tmp_path / "prof"))
    _train_once(engine, model)
    (file,) = (tmp_path / "prof").iterdir()
    assert file.name == "value_rank0_call2.json"
    summary = json.loads(file.read_text())
    assert summary["model"] == "value" and summary["call"] == 2 and summary["ranked_by"] == "self_cpu_ms"
    times = [op["self_cpu_ms"] for op in summary["top"]]
    assert times == sorted(times, reverse=True) and summary["total_self_cpu_ms"] >= sum(times) > 0
    names = {op["name"] for op in summary["top"]}
    assert {"aten::mm", "Optimizer.step#AdamW.step"} & names  # the update's own work was recorded


def test_profiling_from_a_call_leaves_the_earlier_calls_unprofiled(tmp_path, monkeypatch):
    model = torch.nn.Linear(8, 8, bias=False)
    engine = Updater(model, OptimizerConfig(), SchedulerConfig(), 1.0, name="policy")
    monkeypatch.setenv(PROFILE_ENV, str(tmp_path))
    monkeypatch.setenv(PROFILE_FROM_ENV, "3")
    for _ in range(3):
        _train_once(engine, model)
    assert [f.name for f in tmp_path.iterdir()] == ["policy_rank0_call3.json"]
