"""dtppo driven from Python (``dtppo.PPOTrainer``): closures and lambdas as reward functions, an in-memory Dataset
whose extra column reaches them, callbacks that see every step in order, ``step()`` in a loop equal to ``train()``
and both equal to the command line, a trainer used twice resuming, and 2 ranks started from Python."""

import datasets
import pytest

import dtppo
from tests.support.cli import read_jsonl, run_cli
from tests.support.recipes import FAST, RANDOM_START, REPO, TINY

BASE = str(REPO / "recipes" / "base.yaml")
# 2 steps of 8 prompts, 8 new tokens, validation every step, one scoring process (the functions travel to it)
SMALL = [
    *FAST,
    *RANDOM_START,
    "policy.generation.max_new_tokens=8",
    "ppo.max_num_steps=2",
    "ppo.num_prompts_per_step=8",
    "ppo.validation.period=1",
    "ppo.validation.max_samples=8",
    "ppo.validation.batch_size=8",
    "policy.train_micro_batch_size=8",
    "value.train_micro_batch_size=8",
    "logger.progress=false",
    "reward.num_workers=1",
]


def _comparable(record: dict) -> dict:
    """A step's metrics but its timings (and the log's ``step`` field, which the metrics returned lack)."""
    return {k: v for k, v in record.items() if not k.startswith(("timing/", "perf/")) and k != "step"}


class Recorder:
    """Every hook call, in order."""

    def __init__(self):
        self.calls = []

    def on_train_begin(self, config):
        self.calls.append(("begin", config.ppo.max_num_steps))

    def on_step_end(self, step, metrics):
        self.calls.append(("step", step, metrics["train/reward"]))

    def on_validation_end(self, step, metrics):
        self.calls.append(("validation", step))

    def on_save(self, step, path):
        self.calls.append(("save", step, path.name))

    def on_train_end(self, results):
        self.calls.append(("end", results.accuracy_end))


def _custom_rows(count: int) -> list[dict]:
    return [{"prompt": f"Write {i} stars", "stars": i % 5, "topic": ["stars", "coins"][i % 2]} for i in range(count)]


def test_closures_and_a_lambda_score_an_in_memory_dataset_and_callbacks_see_every_step(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    seen_columns = []
    bonus = 0.25

    def star_count(prompts, completions, stars, topic, **kwargs):
        seen_columns.append((list(prompts), list(stars), list(topic)))  # in the scoring process: lost, unless 0 workers
        return [float(c.count("*") == s) for c, s in zip(completions, stars)]

    recorder = Recorder()
    cfg = dtppo.load_config(BASE, [*SMALL, "data.task=custom", "checkpointing.enabled=false"])
    trainer = dtppo.PPOTrainer(
        cfg,
        reward_funcs=[star_count, lambda completions, topic, **kw: [bonus * (t == "stars") for t in topic]],
        train_dataset=datasets.Dataset.from_list(_custom_rows(24)),
        eval_dataset=_custom_rows(8),
        callbacks=[recorder],
    )
    results = trainer.train()
    records = read_jsonl(tmp_path / "logs" / "metrics.jsonl") if (tmp_path / "logs").exists() else None
    assert trainer.config.reward.functions == ("star_count", "reward_1")
    assert recorder.calls[0] == ("begin", 2) and recorder.calls[-1] == ("end", results.accuracy_end)
    assert [c[:2] for c in recorder.calls[1:-1]] == [
        ("validation", 0),
        ("validation", 1),
        ("step", 1),
        ("validation", 2),
        ("step", 2),
    ]
    assert len(trainer.history) == 2 and [c[2] for c in recorder.calls if c[0] == "step"] == [
        m["train/reward"] for m in trainer.history
    ]
    for metrics in trainer.history:  # the lambda's bonus is a quarter on the "stars" half of the rows
        assert metrics["train/reward/reward_1"] == pytest.approx(bonus / 2, abs=bonus / 2)
        assert metrics["train/reward"] == pytest.approx(
            metrics["train/reward/star_count"] + metrics["train/reward/reward_1"], rel=1e-6
        )
    assert records is None or len(records) == 3
    assert seen_columns == []  # scored in the scoring process, never in this one


def test_the_extra_columns_reach_a_function_scored_in_this_process(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    seen = []

    def star_count(prompts, completions, stars, topic, **kwargs):
        seen.append({p: (s, t) for p, s, t in zip(prompts, stars, topic)})
        return [0.0] * len(completions)

    rows = _custom_rows(24)
    overrides = [*SMALL, "data.task=custom", "checkpointing.enabled=false", "reward.num_workers=0"]
    trainer = dtppo.PPOTrainer(
        dtppo.load_config(BASE, overrides), reward_funcs=star_count, train_dataset=rows, eval_dataset=rows[:8]
    )
    trainer.train()
    expected = {r["prompt"]: (r["stars"], r["topic"]) for r in rows}
    assert len(seen) == 5 and all(batch and all(expected[p] == v for p, v in batch.items()) for batch in seen)


def _cli_args(name: str) -> list[str]:
    return [*SMALL, f"logger.log_dir={name}/log", f"checkpointing.checkpoint_dir={name}/ckpt"]


def test_step_in_a_loop_equals_train_and_both_equal_the_command_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_cli(["ppo", TINY, *_cli_args("cli")], tmp_path)
    trained = dtppo.PPOTrainer(dtppo.load_config(TINY, _cli_args("train")))
    results = trained.train()
    stepped = dtppo.PPOTrainer(dtppo.load_config(TINY, _cli_args("step")))
    metrics = [stepped.step() for _ in range(2)]
    with pytest.raises(dtppo.errors.ConfigError, match="^ppo.max_num_steps: the run has done its 2 steps"):
        stepped.step()
    logs = {name: read_jsonl(tmp_path / name / "log" / "metrics.jsonl") for name in ("cli", "train", "step")}
    assert [r["step"] for r in logs["cli"]] == [0, 1, 2]
    assert [r["step"] for r in logs["train"]] == [r["step"] for r in logs["step"]] == [0, 1, 2]
    assert [_comparable(r) for r in logs["train"]] == [_comparable(r) for r in logs["cli"]]
    assert [_comparable(r) for r in logs["step"]] == [_comparable(r) for r in logs["cli"]]
    assert [_comparable(m) for m in metrics] == [_comparable(m) for m in trained.history]
    assert [_comparable(m) for m in stepped.history] == [_comparable(r) for r in logs["cli"][1:]]
    assert results.end_step == 2 and results.accuracy_start == logs["cli"][0]["validation/accuracy"]
    other = dtppo.PPOTrainer(dtppo.load_config(TINY, [*_cli_args("other"), "ppo.seed=1"]))
    other.train()  # the negative control: another seed's run is told apart by the same comparison
    assert [_comparable(m) for m in other.history] != [_comparable(m) for m in trained.history]
    exported = stepped.save_model(tmp_path / "export")
    assert {p.name for p in exported} >= {"policy", "critic"}
    assert (tmp_path / "export" / "policy" / "model.safetensors").is_file()


def test_the_trainer_used_twice_resumes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recorder = Recorder()
    trainer = dtppo.PPOTrainer(dtppo.load_config(TINY, _cli_args("run")), callbacks=[recorder])
    trainer.train()
    again = trainer.train()  # the checkpoint is at the last step: nothing left to run
    assert len(trainer.history) == 2 and again.end_step == 2 and again.mean_step_seconds is None
    longer = dtppo.PPOTrainer(dtppo.load_config(TINY, [*_cli_args("run"), "ppo.max_num_steps=3"]))
    longer.train()
    records = read_jsonl(tmp_path / "run" / "log" / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3] and len(longer.history) == 1
    assert [c for c in recorder.calls if c[0] == "save"] == [("save", 2, "step_2")]


@pytest.mark.slow  # 2 ranks start in ~30 s of forkserver and gloo
def test_two_ranks_from_python_get_the_closure_and_tell_the_callbacks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scale = 0.5

    def half_length(completions, **kwargs):
        return [scale * min(len(c), 8) / 8 for c in completions]

    recorder = Recorder()
    overrides = [*_cli_args("ranks"), "cluster.workers_per_node=2", "checkpointing.enabled=false"]
    trainer = dtppo.PPOTrainer(dtppo.load_config(TINY, overrides), reward_funcs=[half_length], callbacks=[recorder])
    results = trainer.train()
    records = read_jsonl(tmp_path / "ranks" / "log" / "metrics.jsonl")
    assert [c[:2] for c in recorder.calls if c[0] == "step"] == [("step", 1), ("step", 2)]
    assert [_comparable(m) for m in trainer.history] == [_comparable(r) for r in records[1:]]
    assert all(0 < m["train/reward/half_length"] <= scale for m in trainer.history)
    assert results.end_step == 2 and recorder.calls[-1] == ("end", results.accuracy_end)


@pytest.mark.slow  # a Jupyter kernel's start and 2 steps of the number task: ~40 s
def test_the_example_notebook_runs_on_a_jupyter_kernel(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(REPO / "examples" / "python_api.ipynb", as_version=4)
    monkeypatch.setenv("DTPPO_NOTEBOOK_STEPS", "2")
    monkeypatch.setenv("DTPPO_NOTEBOOK_RUN_DIR", str(tmp_path / "run"))
    # the kernel is this interpreter (ipykernel's python3), started in examples/ as Jupyter would start it there
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(REPO / "examples")}}
    )
    client.execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    text = "".join(output.get("text", "") for output in outputs)
    assert "dtppo results" in text and "2 steps; evaluated at step 2" in text
    assert sum("image/png" in output.get("data", {}) for output in outputs) == 1  # the curves, inline
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [0, 1, 2]


@pytest.mark.slow  # a fresh interpreter, its scoring process and 2 steps of the number task: ~25 s
def test_the_example_script_trains_the_number_task(tmp_path):
    import subprocess
    import sys

    script = REPO / "examples" / "train_from_python.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--steps", "2", "--out", str(tmp_path / "run")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "step 0: validation reward" in proc.stdout and "step 2: validation reward" in proc.stdout
    assert "dtppo results" in proc.stdout and "final validation reward" in proc.stdout
    steps = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "train/reward" in r]
    assert len(steps) == 2 and all("train/reward/digit_share" in r for r in steps)
