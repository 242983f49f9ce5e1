"""The DAPO-style and SAO-style recipes, two steps each from the CLI: dynamic sampling fills the step with groups
whose rewards differ, the overlong penalty is logged; the critic makes K passes, its warmup is logged and capped, and
a warm start carries its weights into a new run with a fresh optimizer."""

import shutil

import pytest
import torch

from tests.support.cli import checkpoint_tensors, read_jsonl, run_cli
from tests.support.recipes import REPO

DAPO = str(REPO / "recipes" / "tiny-math-dapo-cpu.yaml")
SAO = str(REPO / "recipes" / "tiny-math-sao-cpu.yaml")
SMALL = [
    "ppo.max_num_steps=2",
    "ppo.validation.max_samples=32",
    "ppo.validation.batch_size=32",
    "ppo.validation.period=2",
    "policy.train_global_batch_size=8",
    "value.train_global_batch_size=8",
    "logger.tensorboard=false",
    "logger.log_dir=log",
    "checkpointing.checkpoint_dir=ckpt",
    "checkpointing.save_period=1",
]


@pytest.mark.slow  # a recipe's CLI run; dynamic sampling: tests/unit/ppo/test_dynamic_sampling.py
def test_dapo_recipe_trains_on_groups_whose_rewards_differ(sft_dir, tmp_path):
    prompts = 4  # x 8 samples: the briefly fine-tuned model solves some of a group's samples, rarely all
    args = [
        f"sft.output_dir={sft_dir}",
        f"ppo.num_prompts_per_step={prompts}",
        "ppo.dynamic_sampling.max_gen_batches=40",
    ]
    run_cli(["ppo", DAPO, *SMALL, *args], tmp_path)
    records = read_jsonl(tmp_path / "log" / "metrics.jsonl")
    steps = [r for r in records if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        batches, kept = r["train/dynamic_sampling/gen_batches"], r["train/dynamic_sampling/kept_groups"]
        assert 1 <= batches <= 40 and kept >= prompts
        assert kept + r["train/dynamic_sampling/filtered_groups"] == batches * prompts
        # every group that trains is mixed: each has samples above and below its mean
        assert r["train/advantages/min"] < 0.0 < r["train/advantages/max"]
        assert r["train/overlong/penalty_mean"] <= 0.0
        assert (r["train/overlong/shaped_samples"] == 0) == (r["train/overlong/penalty_mean"] == 0.0)
        assert not [k for k in r if k.startswith("train/critic/")]

    # A resume from step 1 draws step 2's extra batches from where the loader stood: the same step 2.
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "ckpt" / "step_1", resumed / "ckpt" / "step_1")
    shutil.copytree(tmp_path / "log", resumed / "log")
    run_cli(["ppo", DAPO, *SMALL, *args], resumed)

    def comparable(r):
        return {k: v for k, v in r.items() if not k.startswith(("timing/", "perf/"))}

    assert [comparable(r) for r in read_jsonl(resumed / "log" / "metrics.jsonl")] == [comparable(r) for r in records]
    a, b = (checkpoint_tensors(root / "ckpt" / "step_2", root) for root in (tmp_path, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # two CLI runs; K passes and warm starts: tests/unit
def test_sao_recipe_runs_k_critic_passes_and_its_critic_warm_starts_a_new_run(sft_dir, tmp_path):
    source, warm = tmp_path / "source", tmp_path / "warm"
    source.mkdir(), warm.mkdir()
    common = [
        f"sft.output_dir={sft_dir}",
        "sft.min_accuracy=0",
        "ppo.num_prompts_per_step=16",
        "value.warmup.max_steps=1",
    ]
    run_cli(["ppo", SAO, *SMALL, *common], source)
    steps = [r for r in read_jsonl(source / "log" / "metrics.jsonl") if r["step"] >= 1]
    # the EV gate needs 3 steps of history; the cap of 1 ends the warmup after one critic-only step
    assert [r["train/critic/warmup_steps"] for r in steps] == [1.0, 1.0]
    assert "train/loss" not in steps[0] and "train/loss" in steps[1]
    trainer = torch.load(source / "ckpt" / "step_2" / "trainer.pt", weights_only=True)
    # 16 samples per step in minibatches of 8: 2 optimizer steps per pass, K = 2 passes for the critic
    assert trainer["value"]["scheduler"]["last_epoch"] == 2 * 2 * 2
    assert trainer["policy"]["scheduler"]["last_epoch"] == 2 * 1

    # A new run from the source's critic, with a learning rate too small to move it: its critic is the source's
    # step-2 critic, its optimizer and schedule fresh (one step's passes).
    nudge = ["value.optimizer.lr=1e-12", "value.optimizer.weight_decay=0", "ppo.max_num_steps=1"]
    proc = run_cli(["ppo", SAO, *SMALL, *common, *nudge, f"value.warm_start={source / 'ckpt'}"], warm)
    assert f"warm start from {source / 'ckpt'}" in proc.stdout
    loaded = checkpoint_tensors(warm / "ckpt" / "step_1", tmp_path)
    trained = checkpoint_tensors(source / "ckpt" / "step_2", tmp_path)
    fresh = checkpoint_tensors(source / "ckpt" / "step_1", tmp_path)
    names = [k for k in loaded if k.startswith("value.model.")]
    assert names and max(float((loaded[k] - trained[k]).abs().max()) for k in names) < 1e-6
    assert max(float((loaded[k] - fresh[k]).abs().max()) for k in names) > 1e-4  # not just any critic
    warm_trainer = torch.load(warm / "ckpt" / "step_1" / "trainer.pt", weights_only=True)
    assert warm_trainer["value"]["scheduler"]["last_epoch"] == 2 * 2
