"""The row formats of the file-backed tasks (``dtppo.data.formats``): GSM8K's number after ``####``, MATH's last boxed
answer, and a custom format's columns from the config, all through the same reader; and the config rules of a
task's reward functions and of SFT on it (``dtppo.config``). Prompts as chat messages: tests/unit/data/
test_chat_prompts.py."""

from __future__ import annotations

import json

import pytest
import yaml

from dtppo import config as config_lib
from dtppo.config import ConfigError
from dtppo.data.formats import GSM8K, MATH, row_format
from dtppo.data.rows import DataError, read_jsonl
from tests.support.custom_rows import MESSAGES, custom_config, write_rows
from tests.support.recipes import REPO


def test_custom_rows_keep_every_column_and_read_the_reference(tmp_path):
    path = write_rows(
        tmp_path / "rows.jsonl",
        [
            {"query": "What is 3+4?", "label": 7, "source": "a", "level": 1},
            {"query": MESSAGES, "label": "7", "source": "b", "level": 2},
            {"query": "", "label": 1},  # empty prompt
            {"query": [{"role": "robot", "content": "x"}], "label": 1},  # not a chat message
            {"query": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "label": 1},
            {"query": "No label"},
        ],
    )
    cfg = custom_config(path, "data.prompt_key=query", "data.answer_key=label")
    problems, bad = read_jsonl(path, row_format(cfg.data))
    assert [p.question for p in problems] == ["What is 3+4?", MESSAGES]
    assert [p.answer for p in problems] == [7, "7"] and [p.conversational for p in problems] == [False, True]
    assert problems[0].columns == {"label": 7, "source": "a", "level": 1}  # the prompt is prompts=
    assert dict(bad) == {"missing_query": 1, "bad_messages": 2, "missing_label": 1}


def test_a_missing_prompt_column_names_the_columns_the_rows_have(tmp_path):
    path = write_rows(tmp_path / "rows.jsonl", [{"question": "Q", "answer": "#### 1"}] * 2)
    with pytest.raises(
        DataError,
        match=r"no usable rows \(2 bad: missing_prompt: 2\); the first row's columns "
        r"are \['answer', 'question'\]",
    ):
        read_jsonl(path, row_format(custom_config(path).data))


def test_an_answer_column_besides_the_reference_is_refused(tmp_path):
    path = write_rows(tmp_path / "rows.jsonl", [{"prompt": "Q", "label": "1", "answer": "other"}])
    with pytest.raises(
        DataError,
        match=r"rows.jsonl:1: the rows have a column 'answer' besides the reference "
        r"column 'label'",
    ):
        read_jsonl(path, row_format(custom_config(path, "data.answer_key=label").data))


def test_math_rows_take_the_last_boxed_answer_of_the_solution(tmp_path):
    path = write_rows(
        tmp_path / "math.jsonl",
        [
            {"problem": "Find x.", "solution": "First \\boxed{2}, no: $x=\\boxed{\\frac{1}{2}}$.", "level": "Level 1"},
            {"problem": "No box.", "solution": "It is 3."},
            {"problem": "Q", "solution": "\\boxed{}"},
        ],
    )
    problems, bad = read_jsonl(path, MATH)
    assert [(p.answer, p.solution[:5]) for p in problems] == [("\\frac{1}{2}", "First")]
    assert problems[0].columns["level"] == "Level 1" and dict(bad) == {"no_boxed_answer": 2}


def test_gsm8k_loader_skips_bad_rows(tmp_path):
    rows = [
        {"question": "q1", "answer": "work\n#### 1,200"},
        {"question": "q2"},
        {"question": "q3", "answer": "no marker"},
        {"question": "q4", "answer": "#### twelve"},
        "not a dict",
    ]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{broken json\n")
    problems = read_jsonl(path, GSM8K)[0]
    assert [(p.question, p.answer) for p in problems] == [("q1", "1200")]
    with pytest.raises(FileNotFoundError):
        read_jsonl(tmp_path / "missing.jsonl", GSM8K)[0]


def test_real_gsm8k_files_load():
    test_path = REPO / "tests/data/gsm8k/test.jsonl"  # GSM8K's first 300 test rows
    problems = read_jsonl(test_path, GSM8K)[0]
    assert len(problems) == 300 and problems[0].answer == "18"


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["reward.functions=[gsm8k, math]", "reward.weights=[1.0]"], "reward.weights: needs one weight per reward"),
        (["reward.functions=[a.py:f, b.py:f]"], "reward.functions[1]: a second function named 'f'"),
        (["reward.functions=[a.py:model]"], "reward.functions[0]: 'model' is a metric name dtppo logs itself"),
        (
            ["reward.functions=[gsm8k, a.py:timed_out_chunks]", "reward.weights=[1, 1]"],
            "reward.functions[1]: 'timed_out_chunks' is a metric name dtppo logs itself",
        ),
        (["reward.accuracy_from=mine"], "reward.accuracy_from: 'mine' is neither a built-in verifier nor one of"),
        (["reward.model.batch_size=0"], "reward.model.batch_size: must be >= 1"),
    ],
)
def test_reward_and_task_rules(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        config_lib.from_dict(_tree(overrides))
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (
            [
                "data.task=custom",
                "data.train.path=a",
                "data.validation.path=b",
                "reward.functions=[gsm8k]",
            ],
            "data.answer_key: SFT trains on a target column, and data.task custom names none",
        ),
        (
            [
                "data.task=custom",
                "data.train.path=a",
                "data.validation.path=b",
                "data.answer_key=target",
                "reward.functions=[gsm8k]",
                "sft.patience=2",
                "sft.val_period=5",
            ],
            "sft.patience: sft.patience and sft.min_accuracy judge greedy accuracy, which needs a task's verifier",
        ),
        (
            [
                "cluster.workers_per_node=3",
                "sft.batch_size=32",
                "policy.train_global_batch_size=48",
                "value.train_global_batch_size=48",
                "ppo.num_prompts_per_step=48",
            ],
            "sft.batch_size: 32 must divide evenly over the policy's 3 data-parallel ranks",
        ),
        (["sft.micro_batch_size=0"], "sft.micro_batch_size: must be >= 1"),
        (
            ["sft.batch_size=32", "sft.micro_batch_size=5"],
            "sft.micro_batch_size: 5 must divide the per-rank share",
        ),
    ],
)
def test_what_sft_needs_is_checked_before_it_runs(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        config_lib.check_sft(config_lib.from_dict(_tree(overrides)))
    assert fragment in str(err.value)


def test_a_custom_task_with_a_target_column_may_run_sft():
    overrides = ["data.task=custom", "data.train.path=a", "data.validation.path=b", "data.answer_key=target"]
    config_lib.check_sft(config_lib.from_dict(_tree([*overrides, "reward.functions=[gsm8k]"])))


def _tree(overrides: list[str]) -> dict:
    tree: dict = {}
    for item in overrides:
        key, _, value = item.partition("=")
        *parents, leaf = key.split(".")
        node = tree
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = yaml.safe_load(value)
    return tree


def test_defaults_follow_the_task():
    tiny = config_lib.from_dict({})
    assert (tiny.reward.functions, tiny.reward.weights, tiny.reward.accuracy_from) == (("gsm8k",), (1.0,), "gsm8k")
    math_cfg = config_lib.from_dict({"data": {"task": "math", "train": {"path": "a"}, "validation": {"path": "b"}}})
    assert (math_cfg.reward.functions, math_cfg.reward.accuracy_from) == (("math",), "math")
    custom = config_lib.from_dict(
        {
            "data": {"task": "custom", "train": {"path": "a"}, "validation": {"path": "b"}},
            "reward": {"functions": ["x.py:f", "gsm8k"], "weights": [2, 0.5]},
        }
    )
    assert (custom.reward.weights, custom.reward.accuracy_from) == ((2.0, 0.5), None)


def test_a_task_reads_its_preset_or_the_custom_columns_from_the_config():
    files = {"train": {"path": "a"}, "validation": {"path": "b"}}
    assert row_format(config_lib.from_dict({"data": {"task": "gsm8k", **files}}).data) is GSM8K
    custom = config_lib.from_dict(
        {
            "data": {
                "task": "custom",
                **files,
                "prompt_key": "query",
                "answer_key": "label",
            },
            "reward": {"functions": ["gsm8k"]},
        }
    ).data
    fmt = row_format(custom)
    assert (fmt.prompt_key, fmt.answer_key, fmt.solution_key, fmt.preset) == ("query", "label", "label", False)
