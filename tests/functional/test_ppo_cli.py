"""Two PPO steps of the tiny recipe from the CLI: reference gates, export, eval and plot on the result."""

import math
import re

import pytest
import torch
from transformers import AutoModelForCausalLM

from dtppo.models.value import ValueModel
from tests.support.choice_task import choice_args
from tests.support.cli import checkpoint_tensors, read_jsonl, run_cli, run_cli_in_process
from tests.support.gates import assert_reference_gates, gate_failures
from tests.support.recipes import FAST, RANDOM_START, REPO, TINY


def _ppo_args(*extra: str) -> list[str]:
    """Two steps of two epochs each (a policy that moves shows a ratio != 1 in the second)."""
    return ["ppo", TINY, *FAST, *RANDOM_START, "ppo.max_num_steps=2", "ppo.ppo_epochs=2", *extra]


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("ppo")
    args = _ppo_args(
        "ppo.validation.period=2",
        "loss.ratio_clip_c=3.0",
        "logger.log_dir=log",
        "checkpointing.checkpoint_dir=ckpt",
        "checkpointing.save_period=2",
    )
    proc = run_cli(args, cwd)
    return cwd, proc


def test_reference_gates(ppo_run):
    cwd, proc = ppo_run
    steps = [r for r in read_jsonl(cwd / "log" / "metrics.jsonl") if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2]
    assert_reference_gates(steps)
    assert gate_failures(steps) == []
    for r in steps:
        # γ = λ = 1, 0/1 rewards: each token's return is its sample's reward, so Var(R) ≤ 1/4
        assert 0.0 <= r["train/critic/returns_var"] <= 0.25 + 1e-6
        assert r["timing/generation"] > 0 and r["perf/tokens_per_sec"] > 0
    assert "validation/accuracy" in steps[-1]
    assert "dtppo results" in proc.stdout and "ETA" in proc.stdout
    # The generator's choice, printed once at start (the tiny policy is Qwen2-shaped: auto picks the static decoder).
    assert proc.stdout.count("generation: torch backend, static decoder (qwen2 model)") == 1


# Three steps of two epochs on the task PPO learns fast (tests/support/choice_task.py): every step holds rewarded
# and unrewarded samples, so the reward-dependent gates are tested, not vacuous (the tiny recipe's briefly
# fine-tuned model is rarely right).
GATE_RUN = ["ppo.max_num_steps=3", "ppo.ppo_epochs=2", "ppo.validation.period=3"]


@pytest.mark.parametrize(
    "env, failed",
    [
        ({}, []),
        ({"DTPPO_TEST_LEARNING_FAULT": "zero_advantages"}, ["policy_moved", "advantages_signed"]),
        ({"DTPPO_TEST_LEARNING_FAULT": "drop_rewards"}, ["returns_carry_reward"]),
        ({"DTPPO_TEST_GEN_LOGPROB_ERROR": "0.003"}, ["mismatch"]),
    ],
    ids=["sound", "advantages-zeroed", "reward-not-in-returns", "generator-logprobs-off"],
)
def test_each_gate_fails_on_the_broken_run_it_is_for(choice_task, monkeypatch, env, failed):
    """Negative controls of tests/support/gates.py: each broken run (dtppo.faults) fails exactly its gates, the
    sound run none, and the reference's gates, which hold by construction, pass them all."""
    root, files = choice_task
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    log = "gates_" + "_".join(f"{k}{v}" for k, v in env.items())
    run_cli(choice_args(files, log, *GATE_RUN), root)
    steps = [r for r in read_jsonl(root / log / "metrics.jsonl") if r["step"] >= 1]
    assert all(0.0 < r["train/reward"] < 1.0 for r in steps)  # every step mixed: the gates are not vacuous
    assert_reference_gates(steps)
    assert gate_failures(steps) == failed


def _documented_metrics() -> dict[str, str]:
    """docs/guides/metrics.md's names (``<...>`` a placeholder) and when each is logged."""
    rows = re.findall(
        r"^\| `([a-z_/<>]+)` \| ([^|]+?) \|", (REPO / "docs" / "guides" / "metrics.md").read_text(), re.MULTILINE
    )
    return dict(rows)


def test_the_run_logs_exactly_the_documented_metrics(ppo_run):
    """Every name logged is in docs/guides/metrics.md, and this run (a critic, validation at steps 0 and 2) logs every
    name documented as logged at every step, with a critic, or at validation, and no other."""
    cwd, _ = ppo_run
    documented = _documented_metrics()
    patterns = {name: re.compile(re.sub(r"<[a-z]+>", "[^/]+", name) + "$") for name in documented}
    records = read_jsonl(cwd / "log" / "metrics.jsonl")
    logged = {key for record in records for key in record} - {"step"}
    undocumented = [key for key in logged if not any(p.match(key) for p in patterns.values())]
    assert undocumented == [], "log names missing from docs/guides/metrics.md"
    expected = {n for n, when in documented.items() if when in ("every step", "with a critic", "validation")}
    plain = {key for key in logged if key in documented}
    assert plain == {n for n in expected if "<" not in n}
    for record in records:
        validating = "validation/reward" in record
        kinds = {"validation"} if validating else set()
        if "train/reward" in record:
            kinds |= {"every step", "with a critic"}
        wanted = {n for n, when in documented.items() if when in kinds and "<" not in n}
        assert wanted <= set(record), (record["step"], sorted(wanted - set(record)))
        assert validating or not any(key.startswith("validation/") for key in record)


def test_checkpoint_is_complete_and_exports_to_hf(ppo_run, tmp_path):
    cwd, _ = ppo_run
    assert sorted(p.name for p in (cwd / "ckpt").iterdir()) == ["step_2"]
    step_dir = cwd / "ckpt" / "step_2"
    assert sorted(p.name for p in step_dir.iterdir()) == ["config.yaml", "hf", "manifest.json", "trainer.pt", "weights"]
    state = torch.load(step_dir / "trainer.pt", weights_only=True)
    assert state["steps_done"] == 2 and state["rollouts"] == {"loader": {"epoch": 0, "offset": 32}, "step": 2}
    saved = checkpoint_tensors(step_dir, tmp_path)
    assert any(k.startswith("policy.optim.state") for k in saved)  # optimizer state is in the checkpoint
    run_cli(["export", cwd / "ckpt", tmp_path / "hf"], cwd)
    policy = AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / "policy").eval()
    assert "policy.model.lm_head.weight" not in saved  # the tied embedding is stored once
    for name, tensor in policy.state_dict().items():
        source = "model.embed_tokens.weight" if name == "lm_head.weight" else name
        assert torch.equal(tensor, saved[f"policy.model.{source}"]), name
    critic = ValueModel.from_pretrained(tmp_path / "hf" / "critic").eval()
    for name, tensor in critic.state_dict().items():
        assert torch.equal(tensor, saved[f"value.model.{name}"]), name
    ids = torch.randint(3, 90, (2, 10))
    assert critic.values(ids, torch.ones_like(ids)).shape == (2, 10)


def test_eval_scores_the_latest_checkpoint_and_plot_writes_png(ppo_run):
    cwd, _ = ppo_run
    proc = run_cli(["eval", TINY, *FAST, *RANDOM_START, "checkpointing.checkpoint_dir=ckpt"], cwd)
    logged = [r for r in read_jsonl(cwd / "log" / "metrics.jsonl") if r["step"] == 2][0]
    assert "step" in proc.stdout and "accuracy" in proc.stdout and "Q: " in proc.stdout
    accuracy = float(next(line.split()[-1] for line in proc.stdout.splitlines() if line.startswith("accuracy")))
    assert accuracy == pytest.approx(logged["validation/accuracy"], abs=1e-4)  # same weights, greedy, same problems
    run_cli(["plot", cwd / "log"], cwd)
    png = cwd / "log" / "curves.png"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_bad_override_exits_2_naming_the_key(tmp_path, monkeypatch, capsys):
    code, _, err = run_cli_in_process(["ppo", TINY, "ppo.max_num_stepz=2"], tmp_path, monkeypatch, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "ppo.max_num_stepz" in lines[0]
    code, _, err = run_cli_in_process(["ppo", TINY, "policy.optimizer.lr=-0.1"], tmp_path, monkeypatch, capsys)
    assert code == 2 and "policy.optimizer.lr" in err
    assert not (tmp_path / "runs").exists()  # refused before any compute


@pytest.mark.parametrize(
    "extra, policy_trained",
    [
        (["loss.kl.coef=0.1", "loss.kl.in_reward=true", "loss.kl.estimator=k1"], True),
        (["loss.kl.coef=0.1", "loss.kl.in_reward=false", "loss.kl.estimator=k3", "ppo.ppo_epochs=2"], True),
        (["value.warmup.steps=1", "ppo.gae.length_adaptive_alpha=0.5", "ppo.gae.lambda_value=0.95"], False),
    ],
    ids=["kl-in-reward", "kl-in-loss", "critic-warmup"],
)
def test_one_step_variants(tmp_path, extra, policy_trained):
    run_cli(
        [
            "ppo",
            TINY,
            *FAST,
            *RANDOM_START,
            "ppo.max_num_steps=1",
            "ppo.validation.at_start=false",
            "checkpointing.enabled=false",
            "logger.log_dir=log",
            *extra,
        ],
        tmp_path,
    )
    (record,) = read_jsonl(tmp_path / "log" / "metrics.jsonl")
    assert record["step"] == 1 and math.isfinite(record["train/critic/loss"])
    assert ("train/probs_ratio" in record) == policy_trained
    if "loss.kl.coef=0.1" in extra:
        # the reference starts equal to the policy: the first rollout's KL is ~0 for every estimator
        assert abs(record["train/kl_penalty"]) < 1e-4
