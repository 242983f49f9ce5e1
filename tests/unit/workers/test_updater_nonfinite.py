"""Non-finite losses and gradients: skipped and counted; a streak of them stops the run; a checkpoint never
holds them."""

import math

import pytest
import torch

from dtppo.checkpoint import store as checkpoint
from dtppo.config import OptimizerConfig, SchedulerConfig
from dtppo.errors import CheckpointError, NonFiniteError
from dtppo.faults import NONFINITE_ENV
from dtppo.workers.updater import Updater
from tests.support.batches import synthetic_experience


def _experience(batch=8, width=4):
    return synthetic_experience(batch=batch, width=width)


def _engine(limit, name="policy"):
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    return model, Updater(
        model, OptimizerConfig(lr=0.1), SchedulerConfig(), max_grad_norm=1.0, name=name, max_consecutive_nonfinite=limit
    )


def _loss(model, bad_calls, calls):
    """Squared error; NaN on the listed calls (one call = one minibatch here: micro = global batch)."""

    def fn(micro):
        calls.append(1)
        loss = ((model(micro.input_ids[:, :1]) - micro.returns[:, :1]) ** 2).sum()
        return (loss * float("nan") if len(calls) - 1 in bad_calls else loss), {}

    return fn


def test_streak_below_the_limit_is_skipped_counted_and_forgiven():
    model, engine = _engine(limit=3)
    calls = []
    for _ in range(3):  # 3 train() calls x 2 minibatches = optimizer steps 0..5; steps 1, 2 and 4 are NaN
        engine.train(_experience(), _loss(model, {1, 2, 4}, calls), global_batch=4, micro_batch=4)
    assert engine.skipped_steps == 3
    assert engine.consecutive_nonfinite == 0  # step 5 was finite: the streak of 2 (steps 1-2) did not stop it
    assert engine.scheduler.last_epoch == 6  # the schedule advances on skipped steps too
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_limit_consecutive_nonfinite_steps_raise_with_the_count_and_the_key():
    model, engine = _engine(limit=3, name="value")
    calls = []
    engine.train(_experience(), _loss(model, {1, 2, 3}, calls), global_batch=4, micro_batch=4)  # steps 0, 1
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(NonFiniteError) as err:
        engine.train(_experience(), _loss(model, {1, 2, 3}, calls), global_batch=4, micro_batch=4)  # 2, 3
    assert engine.skipped_steps == 3 and engine.consecutive_nonfinite == 3
    message = str(err.value)
    assert message.startswith("value: 3 consecutive optimizer steps")
    assert "ppo.max_consecutive_nonfinite_steps = 3" in message
    assert "\n" not in message
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # no update after the last good one


def test_zero_limit_never_stops():
    model, engine = _engine(limit=0)
    calls = []
    for _ in range(4):
        engine.train(_experience(), _loss(model, set(range(8)), calls), global_batch=4, micro_batch=4)
    assert engine.skipped_steps == 8 and engine.consecutive_nonfinite == 8


def test_infinite_loss_with_a_finite_gradient_is_skipped():
    model, engine = _engine(limit=3)
    before = [p.detach().clone() for p in model.parameters()]

    def inf_loss(micro):
        return model(micro.input_ids[:, :1]).sum() + torch.tensor(math.inf), {}

    metrics = engine.train(_experience(), inf_loss, global_batch=8, micro_batch=8)
    assert torch.isfinite(metrics["grad_norm"]) and not torch.isfinite(metrics["loss"])
    assert engine.skipped_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_streak_is_part_of_the_checkpointed_state():
    model, engine = _engine(limit=3)
    calls = []
    engine.train(_experience(), _loss(model, {1}, calls), global_batch=4, micro_batch=4)
    _, resumed = _engine(limit=3)
    resumed.load_extra_state(engine.extra_state())
    assert (resumed.skipped_steps, resumed.consecutive_nonfinite, resumed.scheduler.last_epoch) == (1, 1, 2)


def test_env_hook_makes_the_named_models_listed_steps_nonfinite(monkeypatch):
    monkeypatch.setenv(NONFINITE_ENV, "policy:1,2;value:0")
    policy_model, policy = _engine(limit=0, name="policy")
    value_model, value = _engine(limit=0, name="value")
    for _ in range(2):
        policy.train(_experience(), _loss(policy_model, set(), []), global_batch=4, micro_batch=4)
        value.train(_experience(), _loss(value_model, set(), []), global_batch=4, micro_batch=4)
    assert policy.skipped_steps == 2 and value.skipped_steps == 1


def test_save_refuses_nonfinite_state_and_keeps_the_previous_checkpoint(tmp_path):
    good = {"policy": {"model": {"w": torch.ones(3)}, "optim": {"state": {"w": {"exp_avg": torch.zeros(3)}}}}}
    checkpoint.save(tmp_path, 1, good, {"steps_done": 1}, {"x": 1}, keep_last=5)
    nan = torch.tensor([0, math.nan, 0])
    bad = {"policy": {"model": {"w": torch.ones(3)}, "optim": {"state": {"w": {"exp_avg": nan}}}}}
    expected = r"refusing to write .*step_2: policy\.optim\.state\.w\.exp_avg holds NaN/inf"
    with pytest.raises(CheckpointError, match=expected):
        checkpoint.save(tmp_path, 2, bad, {"steps_done": 2}, {"x": 1}, keep_last=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]
    target = {"policy": {"model": {"w": torch.zeros(3)}, "optim": {"state": {"w": {"exp_avg": torch.ones(3)}}}}}
    replicated, _ = checkpoint.load(tmp_path / "step_1", target)
    assert replicated["steps_done"] == 1 and torch.equal(target["policy"]["model"]["w"], torch.ones(3))


def test_the_fused_step_skips_on_the_device_flag_exactly(monkeypatch):
    # The accelerator path (fused AdamW reading found_inf, no host sync), run on the CPU's fused kernel: a
    # non-finite minibatch leaves weights, Adam's moments and step count as they were, and a finite one updates
    # as the unfused AdamW does (the same formula; a different kernel, so within float32 round-off).
    monkeypatch.setattr("dtppo.workers.updater.fused_step", lambda device, params: True)
    model, fused = _engine(limit=0)
    assert fused.optimizer.defaults["fused"]
    calls = []
    fused.train(_experience(), _loss(model, {1}, calls), global_batch=4, micro_batch=4)  # step 0 good, 1 NaN
    after_good = {k: v.clone() for k, v in fused.optimizer.state[model.weight].items()}
    weights = [p.detach().clone() for p in model.parameters()]
    fused.train(_experience(), _loss(model, {2, 3}, calls), global_batch=4, micro_batch=4)  # steps 2, 3 NaN
    assert fused.skipped_steps == 3 and fused.consecutive_nonfinite == 3
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    state = fused.optimizer.state[model.weight]
    assert all(torch.equal(state[k], after_good[k]) for k in after_good)  # step count included
    assert float(state["step"]) == 1.0

    monkeypatch.undo()
    reference_model, reference = _engine(limit=3)
    reference.train(_experience(), _loss(reference_model, {1}, []), global_batch=4, micro_batch=4)
    torch.testing.assert_close(weights, [p.detach() for p in reference_model.parameters()], rtol=1e-6, atol=1e-7)


def test_the_fused_step_stops_a_streak_at_the_end_of_the_pass(monkeypatch):
    monkeypatch.setattr("dtppo.workers.updater.fused_step", lambda device, params: True)
    model, engine = _engine(limit=2)
    with pytest.raises(NonFiniteError, match="policy: 2 consecutive optimizer steps"):
        engine.train(_experience(), _loss(model, {0, 1}, []), global_batch=4, micro_batch=4)
