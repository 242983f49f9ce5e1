import copy
import dataclasses
import types

import torch

from dtppo.config import OptimizerConfig, SchedulerConfig
from dtppo.ops import masked_sum, weighted_sum
from dtppo.workers.updater import Updater, lr_lambda
from tests.support.batches import synthetic_experience, unequal_rows_mask


def _experience(batch=8, width=6):
    """Feature rows with unequal valid-token counts per row."""
    return synthetic_experience(batch=batch, width=width, response_mask=unequal_rows_mask(batch, width))


def _loss_fn(model):
    def fn(micro):
        pred = model(micro.input_ids.unsqueeze(-1)).squeeze(-1)
        return weighted_sum((pred - micro.returns) ** 2, micro.loss_weights), {"x_sum": micro.response_mask.sum()}

    return fn


def test_microbatch_1_x_8_equals_8_x_1():
    torch.manual_seed(1)
    base = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    results = []
    for micro in (1, 8, 4):
        model = copy.deepcopy(base)
        engine = Updater(model, OptimizerConfig(lr=1e-2), SchedulerConfig(), max_grad_norm=100.0)
        metrics = engine.train(_experience(), _loss_fn(model), global_batch=8, micro_batch=micro)
        results.append((metrics, [p.detach().clone() for p in model.parameters()]))
    for metrics, params in results[1:]:
        assert abs(metrics["loss"] - results[0][0]["loss"]) < 1e-6
        assert abs(metrics["grad_norm"] - results[0][0]["grad_norm"]) < 1e-6
        assert metrics["x"] == results[0][0]["x"] == 1.0
        for a, b in zip(params, results[0][1]):
            assert (a - b).abs().max() < 1e-6


def test_nonfinite_gradient_skips_the_step_and_counts_it():
    model = torch.nn.Linear(1, 1)
    engine = Updater(model, OptimizerConfig(lr=0.1), SchedulerConfig(), max_grad_norm=1.0)
    before = [p.detach().clone() for p in model.parameters()]

    def nan_loss(micro):
        return model(micro.input_ids[:, :1]).sum() * float("nan"), {}

    metrics = engine.train(_experience(), nan_loss, global_batch=4, micro_batch=4)
    assert engine.skipped_steps == 2 and not torch.isfinite(metrics["grad_norm"])
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_cosine_schedule_with_warmup():
    f = lr_lambda(SchedulerConfig(kind="cosine", warmup_steps=10, total_steps=110, min_lr_ratio=0.1))
    assert abs(f(0) - 0.1) < 1e-9 and f(9) == 1.0 and f(10) == 1.0
    assert abs(f(60) - 0.55) < 1e-9 and abs(f(110) - 0.1) < 1e-9 and abs(f(500) - 0.1) < 1e-9


def test_step_metrics_aggregate_minibatches_and_epochs_as_documented():
    # docs/design/algorithm.md "How step metrics aggregate minibatches and epochs". lr = 0 keeps the model fixed, so
    # each minibatch's loss can be recomputed here; the two minibatches have different token counts. OptimizerConfig
    # refuses lr = 0 (no recipe may ask for it), so the engine gets its fields in a plain namespace.
    from dtppo.observability.metrics import mean_over

    torch.manual_seed(2)
    model = torch.nn.Linear(1, 1)
    exp = _experience()
    frozen = types.SimpleNamespace(**dataclasses.asdict(OptimizerConfig()) | {"lr": 0.0, "weight_decay": 0.0})
    engine = Updater(model, frozen, SchedulerConfig(), max_grad_norm=100.0)

    def loss_fn(micro):
        err = (model(micro.input_ids.unsqueeze(-1)).squeeze(-1) - micro.returns) ** 2
        tokens = micro.response_mask
        stats = {"err_sum": masked_sum(err, tokens), "err_max": torch.where(tokens.bool(), err, -torch.inf).max()}
        return weighted_sum(err, micro.loss_weights), {k: v.detach() for k, v in stats.items()}

    epochs = [engine.train(exp, loss_fn, global_batch=4, micro_batch=2) for _ in range(2)]
    with torch.no_grad():
        err = (model(exp.input_ids.unsqueeze(-1)).squeeze(-1) - exp.returns) ** 2 * exp.response_mask
    per_minibatch = [err[i : i + 4].sum() / exp.response_mask[i : i + 4].sum() for i in (0, 4)]
    assert exp.response_mask[:4].sum() != exp.response_mask[4:].sum()
    # loss: mean over minibatches of each one's token mean; *_sum stats: token mean over the whole pass
    torch.testing.assert_close(epochs[0]["loss"], torch.stack(per_minibatch).mean())
    torch.testing.assert_close(epochs[0]["err"], err.sum() / exp.response_mask.sum())
    torch.testing.assert_close(epochs[0]["err_max"], err.max())
    # over epochs: extremes stay extremes, the rest is averaged
    bumped = dict(epochs[1], err_max=epochs[1]["err_max"] + 1.0, loss=epochs[1]["loss"] + 2.0)
    step = mean_over([epochs[0], bumped])
    assert step["err_max"] == bumped["err_max"]
    torch.testing.assert_close(step["loss"], epochs[0]["loss"] + 1.0)


def _tied_lm(seed: int):
    from dtppo.config import ModelConfig
    from dtppo.models.causal_lm import build_causal_lm

    model = build_causal_lm(None, ModelConfig().tiny, 40, 0, 1, seed)
    engine = Updater(model, OptimizerConfig(lr=1e-2), SchedulerConfig(), max_grad_norm=1.0)
    model(input_ids=torch.randint(0, 40, (2, 6))).logits.square().mean().backward()
    engine.optimizer_step()
    return model, engine


def test_a_tied_embedding_is_saved_once_and_tied_again_on_load(tmp_path):
    from dtppo.checkpoint import store as checkpoint

    model, engine = _tied_lm(seed=0)
    state = engine.state_dict()
    assert engine.tied == {"lm_head.weight": "model.embed_tokens.weight"}
    assert "lm_head.weight" not in state["model"] and "model.embed_tokens.weight" in state["model"]
    new = checkpoint.save(tmp_path / "new", 1, {"policy": state}, {}, {}, keep_last=1)
    # a checkpoint written before: the embedding under both names
    old_state = {
        "model": dict(state["model"], **{"lm_head.weight": state["model"]["model.embed_tokens.weight"]}),
        "optim": state["optim"],
    }
    old = checkpoint.save(tmp_path / "old", 1, {"policy": old_state}, {}, {}, keep_last=1)
    embedding_bytes = model.model.embed_tokens.weight.numel() * 4
    size = {p: sum(f.stat().st_size for f in (p / "weights").iterdir()) for p in (new, old)}
    assert size[old] - size[new] >= embedding_bytes  # one copy fewer
    for step_dir in (new, old):
        fresh, fresh_engine = _tied_lm(seed=1)
        target = {"policy": fresh_engine.state_dict()}
        checkpoint.load(step_dir, target)
        fresh_engine.load_state_dict(target["policy"])
        assert fresh.lm_head.weight is fresh.model.embed_tokens.weight
        for name, tensor in model.state_dict().items():
            assert torch.equal(fresh.state_dict()[name], tensor), (step_dir, name)
        exp_avg = fresh_engine.optimizer.state[fresh.model.embed_tokens.weight]["exp_avg"]
        assert torch.equal(exp_avg, engine.optimizer.state[model.model.embed_tokens.weight]["exp_avg"])
