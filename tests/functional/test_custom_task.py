"""Your own task through the CLI: a jsonl with its own columns, reward functions from a file (TRL's signature),
chat-message prompts, the weighted total, and every bad input as exit 2 with one line naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import read_jsonl, run_cli, run_cli_in_process
from tests.support.recipes import FAST, REPO

BASE = str(REPO / "recipes" / "base.yaml")
# The shared fast settings, then this file's own (the later override wins): 2 steps of 8 prompts, 8 new tokens,
# one micro-batch per minibatch, no checkpoints, one scoring process.
SMALL = [
    *FAST,
    "policy.generation.max_new_tokens=8",
    "ppo.max_num_steps=2",
    "ppo.num_prompts_per_step=8",
    "ppo.validation.period=2",
    "ppo.validation.max_samples=8",
    "ppo.validation.batch_size=8",
    "policy.train_micro_batch_size=8",
    "value.train_micro_batch_size=8",
    "checkpointing.enabled=false",
    "logger.progress=false",
    "reward.num_workers=1",
]

REWARDS = """
import json, os

def _record(name, prompts, completions, kwargs):
    with open(os.environ["RECORD"], "a") as fh:
        fh.write(json.dumps({"fn": name, "prompts": prompts, "completions": completions, "columns": kwargs}) + "\\n")

def length_score(prompts, completions, threshold, topic, **kwargs):
    _record("length_score", prompts, completions, dict(kwargs, threshold=threshold, topic=topic))
    return [len(c) / 8 + t / 100 for c, t in zip(completions, threshold)]

def topic_score(prompts, completions, topic, **kwargs):
    return [float(t == "stars") for t in topic]

def trl_style(completions, **kwargs):
    _record("trl_style", kwargs.get("prompts"), completions, {k: v for k, v in kwargs.items() if k != "prompts"})
    return [float(len(c[0]["content"])) for c in completions]

def raises(completions, **kwargs):
    raise ZeroDivisionError("no reward today")

def needs_label(completions, label, **kwargs):
    return [0.0] * len(completions)

SCORE = 1.0
"""


def _rows(count: int) -> list[dict]:
    topics = ["stars", "coins"]
    return [{"prompt": f"Write {i} stars", "threshold": i, "topic": topics[i % 2]} for i in range(count)]


@pytest.fixture
def task(tmp_path) -> Path:
    (tmp_path / "rewards.py").write_text(REWARDS)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(40)))
    chat = [{"prompt": [{"role": "user", "content": r["prompt"]}], "topic": r["topic"]} for r in _rows(16)]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat))
    return tmp_path


def _args(task: Path, functions: str, data: str = "train.jsonl", *extra: str) -> list[str]:
    return [
        "ppo",
        BASE,
        "data.task=custom",
        f"data.train.path={data}",
        f"data.validation.path={data}",
        f"reward.functions={functions}",
        "logger.log_dir=log",
        *SMALL,
        *extra,
    ]


def _run(task: Path, args: list[str]) -> subprocess.CompletedProcess:
    """``dtppo ARGS`` in ``task`` (tests.support.cli's forked runner), ``RECORD`` naming where the functions write."""
    return run_cli(args, task, timeout=600, check=False, env={"RECORD": str(task / "record.jsonl")})


def test_a_reward_file_gets_the_rows_columns_and_the_total_is_the_weighted_sum(task):
    proc = _run(
        task,
        _args(task, "[rewards.py:length_score, rewards.py:topic_score]", "train.jsonl", "reward.weights=[0.5, 2.0]"),
    )
    assert proc.returncode == 0, proc.stderr
    rows = {r["prompt"]: r for r in _rows(40)}
    records = [r for r in read_jsonl(task / "record.jsonl") if r["fn"] == "length_score"]
    assert len(records) == 4  # 2 steps and 2 validations, each one chunk of 8 in one scoring process
    for record in records:
        assert sorted(record["columns"]) == ["threshold", "topic"]  # exactly the rows' other columns
        assert [rows[p]["threshold"] for p in record["prompts"]] == record["columns"]["threshold"]
        assert [rows[p]["topic"] for p in record["prompts"]] == record["columns"]["topic"]
    steps = [m for m in read_jsonl(task / "log" / "metrics.jsonl") if "train/reward" in m]
    assert len(steps) == 2
    for m in steps:
        weighted = 0.5 * m["train/reward/length_score"] + 2.0 * m["train/reward/topic_score"]
        assert m["train/reward"] == pytest.approx(weighted, rel=1e-6)
    validations = [m for m in read_jsonl(task / "log" / "metrics.jsonl") if "validation/reward" in m]
    assert len(validations) == 2 and "validation/accuracy" not in validations[0]  # no verifier: no accuracy
    assert {"validation/reward/length_score", "validation/reward/topic_score"} <= set(validations[0])


def test_a_trl_style_function_on_chat_messages(task):
    proc = _run(task, _args(task, "[rewards.py:trl_style]", "chat.jsonl"))
    assert proc.returncode == 0, proc.stderr
    record = read_jsonl(task / "record.jsonl")[0]
    assert record["prompts"][0][0]["role"] == "user" and sorted(record["columns"]) == ["topic"]
    assert all(c[0]["role"] == "assistant" and len(c) == 1 for c in record["completions"])
    steps = [m for m in read_jsonl(task / "log" / "metrics.jsonl") if "train/reward/trl_style" in m]
    assert len(steps) == 2 and steps[0]["train/reward"] == pytest.approx(steps[0]["train/reward/trl_style"], rel=1e-6)


# (reward.functions, overrides, the one line's fragment, found in a rank): a spec is checked when the recipe loads,
# in the CLI's own process (run here through dtppo.cli.main); the rest only once ranks read the rows or score.
@pytest.mark.parametrize(
    "functions, extra, fragment, in_a_rank",
    [
        (
            "[missing.py:f]",
            [],
            "reward.functions[0]: reward function 'missing.py:f': file not found: missing.py",
            False,
        ),
        ("[rewards.py:absent]", [], "rewards.py has no 'absent'", False),
        ("[rewards.py:SCORE]", [], "SCORE is a float, not callable", False),
        ("[rewards.py:needs_label]", [], "needs a column 'label' that the rows do not have", True),
        ("[rewards.py:topic_score]", ["data.prompt_key=query"], "no usable rows (40 bad: missing_query: 40)", True),
    ],
)
def test_bad_reward_inputs_exit_2_with_one_line_before_a_step(
    task, functions, extra, fragment, in_a_rank, monkeypatch, capsys
):
    args = _args(task, functions, "train.jsonl", *extra)
    if in_a_rank:
        proc = _run(task, args)
        code, err = proc.returncode, proc.stderr
    else:
        code, _, err = run_cli_in_process(args, task, monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in err, err
    metrics = task / "log" / "metrics.jsonl"
    assert not metrics.exists() or not [m for m in read_jsonl(metrics) if "train/reward" in m]


def test_a_function_that_always_raises_stops_a_short_run_naming_it(task):
    """Each raise fails its chunk (a flaky service's would pass); after the last of 2 steps, all 4 chunks failed."""
    proc = _run(task, _args(task, "[rewards.py:raises]"))
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dtppo: error")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "rewards.py:raises' raised ZeroDivisionError: no reward today on 4 chunk(s); 4 of the 4 chunks" in errors[0]
    assert errors[0].endswith("stopped after step 2 (not checkpointed: checkpointing is off)")
    steps = [m for m in read_jsonl(task / "log" / "metrics.jsonl") if "train/reward" in m]
    assert [m["train/reward"] for m in steps] == ["nan", "nan"]  # no reward known, nothing trained
    assert all(m["train/reward/raised_chunks"] == 1 and "train/critic/loss" not in m for m in steps)


def test_the_readme_example_runs(tmp_path):
    """examples/: the dataset script, the reward file and the recipe, as README "Your own task" runs them."""
    data = tmp_path / "number-task"
    subprocess.run(
        [sys.executable, str(REPO / "examples" / "make_number_task.py"), str(data)], check=True, capture_output=True
    )
    run_cli(
        [
            "ppo",
            REPO / "examples" / "number-task.yaml",
            f"data.train.path={data / 'train.jsonl'}",
            f"data.validation.path={data / 'test.jsonl'}",
            f"logger.log_dir={tmp_path / 'log'}",
            "checkpointing.enabled=false",
            "ppo.max_num_steps=2",
            "ppo.validation.period=2",
            "ppo.validation.max_samples=16",
            "reward.num_workers=1",
        ],
        cwd=REPO,
    )
    steps = [m for m in read_jsonl(tmp_path / "log" / "metrics.jsonl") if "train/reward" in m]
    assert len(steps) == 2 and 0.0 <= steps[0]["train/reward/digit_share"] <= 1.0


def test_math_rows_train_with_the_math_verifier(tmp_path):
    rows = [
        {"problem": f"What is {i} halves?", "solution": f"It is $\\boxed{{\\frac{{{i}}}{{2}}}}$.", "level": "1"}
        for i in range(1, 17)
    ]
    (tmp_path / "math.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_cli(
        [
            "ppo",
            BASE,
            "data.task=math",
            "data.train.path=math.jsonl",
            "data.validation.path=math.jsonl",
            "logger.log_dir=log",
            *SMALL,
            "ppo.max_num_steps=1",
            "ppo.validation.period=1",
        ],
        cwd=tmp_path,
    )
    records = read_jsonl(tmp_path / "log" / "metrics.jsonl")
    step = next(m for m in records if "train/reward" in m)
    assert step["train/reward"] == step["train/reward/math"]  # the task's verifier is the default reward
    validation = [m for m in records if "validation/accuracy" in m]
    assert len(validation) == 2 and validation[0]["validation/accuracy"] == validation[0]["validation/reward/math"]
