"""HF ``datasets`` sources: a ``save_to_disk`` directory (one dataset or several splits) gives the same problems
and bad-row counts as the same rows in jsonl; the HF keys are checked by preflight naming the key; a missing
``datasets`` package or a hub id without network is one clear error, never a traceback or a retry loop."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dtppo import config as config_lib
from dtppo.config import ConfigError
from dtppo.data.formats import GSM8K
from dtppo.data.rows import DataError, RowRules, read_jsonl
from dtppo.launch.preflight import preflight
from tests.support.recipes import TINY, tiny_config

# Arrow columns hold one type, so a bad value is None, empty or malformed text (the jsonl tests cover the rest).
RECORDS = [
    {"question": "Tom has 2 apples and buys 3. How many?", "answer": "2 + 3 = 5\n#### 5"},
    {"question": None, "answer": "#### 4"},
    {"question": "   ", "answer": "#### 4"},
    {"question": "Q without answer", "answer": None},
    {"question": "Q", "answer": "no marker here"},
    {"question": "Q", "answer": "work\n####   "},
    {"question": "Q", "answer": "#### twelve"},
    {"question": "Anna has 10 pens and loses 4. How many?", "answer": "10 - 4 = 6\n#### 1,006"},
    {"question": "A short one", "answer": "#### -3.5"},
]
FIRST_BAD_ROW = 1


@pytest.fixture(scope="module")
def datasets():
    return pytest.importorskip("datasets")


@pytest.fixture
def saved(datasets, tmp_path) -> dict[str, Path]:
    """The same rows as jsonl, as one saved dataset, and as a saved DatasetDict with splits train / test."""
    rows = datasets.Dataset.from_list(RECORDS)
    paths = {"jsonl": tmp_path / "rows.jsonl", "disk": tmp_path / "single", "dict": tmp_path / "splits"}
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    rows.save_to_disk(str(paths["disk"]))
    datasets.DatasetDict({"train": rows, "test": rows.select([0, 8])}).save_to_disk(str(paths["dict"]))
    return paths


def _load(train: Path | str, *extra: str) -> config_lib.Config:
    cfg = tiny_config("data.task=gsm8k", f"data.train.path={train}", f"data.validation.path={train}", *extra)
    preflight(cfg)
    return cfg


def test_a_saved_dataset_reads_like_the_same_jsonl(saved):
    from dtppo.data.hf import read_hf

    cfg = _load(saved["disk"])
    expected, expected_bad = read_jsonl(saved["jsonl"], GSM8K)
    problems, bad = read_hf("data.train", cfg.data.train, GSM8K, None, RowRules())
    assert problems == expected and bad == expected_bad
    assert [p.answer for p in problems] == ["5", "1006", "-3.5"]
    assert bad == {
        "missing_question": 2,
        "missing_answer": 1,
        "no_answer_line": 1,
        "empty_answer": 1,
        "non_numeric_answer": 1,
    }
    assert read_hf("data.train", cfg.data.train, GSM8K, 2, RowRules())[0] == expected[:2]


def test_a_split_of_a_dataset_dict_through_build_sources(saved):
    from dtppo.data.loader import build_sources

    cfg = _load(saved["dict"], "data.train.split=train", "data.validation.split=test")
    train, validation = build_sources(cfg.data, cfg.ppo.seed, cfg.ppo.validation.max_samples)
    assert [p.answer for p in train] == ["5", "1006", "-3.5"]
    assert [p.answer for p in validation] == ["5", "-3.5"]


def test_a_bad_row_under_on_bad_row_error_names_the_dataset_row(saved):
    from dtppo.data.loader import build_sources

    cfg = _load(saved["dict"], "data.train.split=train", "data.validation.split=test", "data.on_bad_row=error")
    with pytest.raises(DataError) as err:
        build_sources(cfg.data, cfg.ppo.seed, cfg.ppo.validation.max_samples)
    assert str(err.value).startswith(f"{saved['dict']}[train] row {FIRST_BAD_ROW}: bad GSM8K row (missing_question)")
    assert err.value.exit_code == 2


def test_no_usable_rows_and_missing_columns_are_data_errors(datasets, tmp_path):
    from dtppo.data.hf import read_hf

    bad_only = tmp_path / "bad_only"
    datasets.Dataset.from_list(RECORDS[1:3]).save_to_disk(str(bad_only))
    with pytest.raises(DataError, match=rf"^{bad_only}: no usable rows \(2 bad: missing_question: 2\)$"):
        read_hf("data.train", _load(bad_only).data.train, GSM8K, None, RowRules())
    renamed = tmp_path / "renamed"
    datasets.Dataset.from_list([{"problem": "Q", "answer": "#### 1"}]).save_to_disk(str(renamed))
    with pytest.raises(DataError, match=r"^data\.train\.path: .* has no column 'question'"):
        read_hf("data.train", _load(renamed).data.train, GSM8K, None, RowRules())


@pytest.mark.parametrize(
    "extra, key",
    [
        ([], "data.train.split"),  # a DatasetDict needs a split
        (["data.train.split=validation"], "data.train.split"),  # not one of its splits
        (["data.train.split=train", "data.train.hf_config=main"], "data.train.hf_config"),  # local: no configs
    ],
)
def test_hf_keys_that_do_not_fit_the_directory_are_refused(saved, extra, key):
    with pytest.raises(ConfigError) as err:
        preflight(
            tiny_config(
                "data.task=gsm8k",
                f"data.train.path={saved['dict']}",
                f"data.validation.path={saved['jsonl']}",
                *extra,
            )
        )
    assert str(err.value).startswith(key + ":"), err.value


def test_a_single_dataset_has_no_splits_and_a_hub_id_needs_one(saved):
    with pytest.raises(ConfigError, match=r"^data\.train\.split: .* holds a single dataset"):
        _load(saved["disk"], "data.train.split=train")
    with pytest.raises(ConfigError, match=r"^data\.train\.split: required for hub dataset openai/gsm8k"):
        preflight(
            tiny_config("data.task=gsm8k", "data.train.path=openai/gsm8k", f"data.validation.path={saved['jsonl']}")
        )


def test_a_directory_that_is_not_a_saved_dataset_is_refused(datasets, tmp_path):
    (tmp_path / "notes").mkdir()
    with pytest.raises(ConfigError, match=r"^data\.train\.path: .*notes is not a dataset directory written by "):
        _load(tmp_path / "notes")


@pytest.mark.parametrize(
    "overrides, key, extra",
    [
        (["data.task=gsm8k", "data.train.path=openai/gsm8k", "data.train.split=train"], "data.train.path", "hf"),
        (["logger.wandb.enabled=true"], "logger.wandb.enabled", "wandb"),
        (["logger.mlflow.enabled=true"], "logger.mlflow.enabled", "mlflow"),
    ],
)
def test_a_missing_optional_package_is_a_config_error_with_the_install_command(
    monkeypatch, tmp_path, overrides, key, extra
):
    """As if the package were not installed (find_spec finds nothing): refused by preflight, before any compute."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("datasets", "wandb", "mlflow") else real(name, *a),
    )
    jsonl = tmp_path / "v.jsonl"
    jsonl.write_text(json.dumps(RECORDS[0]) + "\n")
    with pytest.raises(ConfigError) as err:
        preflight(tiny_config(f"data.validation.path={jsonl}", *overrides))
    assert str(err.value).startswith(f"{key}: needs the ") and f"pip install 'dtppo[{extra}]'" in str(err.value)


def test_a_hub_id_without_network_is_one_line_exit_2_quickly(datasets, tmp_path):
    """Offline (as on a cluster node without internet): no retry loop, one line naming the key."""
    jsonl = tmp_path / "v.jsonl"
    jsonl.write_text(json.dumps(RECORDS[0]) + "\n")
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    args = [
        "ppo",
        TINY,
        "ppo.init_from_sft=false",
        "data.task=gsm8k",
        "data.train.path=openai/gsm8k",
        "data.train.hf_config=main",
        "data.train.split=train",
        f"data.validation.path={jsonl}",
        "logger.tensorboard=false",
        "checkpointing.enabled=false",
    ]
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "dtppo", *map(str, args)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "dtppo: error: data.train.path: cannot load the HF dataset openai/gsm8k (hf_config main, split train)"
    ), proc.stderr
    assert elapsed < 120  # the whole CLI, imports included, on a loaded 2-core machine; a retry loop takes minutes
