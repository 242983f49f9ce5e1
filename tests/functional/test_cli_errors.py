"""Every user-facing input failure through the CLI: exit 2, exactly one line on stderr naming the key or the
path, no traceback; with DTPPO_DEBUG=1 the traceback comes first and the same line last.

The cases cover a bad recipe, bad data found in the parent process (SFT) and in a rank (PPO), a missing or
empty checkpoint directory, a missing SFT model, model directories that are not models, and a missing log
directory; and model directories a user's first runs brought: weights in a pickle, no tokenizer."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import run_cli, run_cli_in_process
from tests.support.hf_fixtures import QWEN_TEMPLATE, with_pickled_weights, without_tokenizer
from tests.support.recipes import TINY

GOOD_ROW = json.dumps({"question": "Tom has 2 apples and buys 3. How many?", "answer": "2 + 3 = 5\n#### 5"})


def _gsm8k(path: str) -> list[str]:
    return ["data.task=gsm8k", f"data.train.path={path}", f"data.validation.path={path}"]


# (case, CLI arguments, a fragment the one line must contain, also run with DTPPO_DEBUG=1)
CASES = [
    ("missing recipe", ["sft", "nope.yaml"], "recipe: file not found: nope.yaml", True),
    ("recipe with a missing parent", ["sft", "orphan.yaml"], "defaults: recipe file not found: 'gone.yaml'", False),
    (
        "recipe names a missing data file",
        ["sft", TINY, *_gsm8k("missing.jsonl")],
        "data.train.path: file not found: missing.jsonl",
        False,
    ),
    (
        "no usable rows (SFT, this process)",
        ["sft", TINY, *_gsm8k("bad.jsonl"), "sft.output_dir=sft"],
        "bad.jsonl: no usable rows (2 bad: invalid_json: 1, missing_answer: 1)",
        True,
    ),
    (
        "bad row refused (PPO, in the rank)",
        ["ppo", TINY, "ppo.init_from_sft=false", *_gsm8k("mixed.jsonl"), "data.on_bad_row=error"],
        "mixed.jsonl:2: bad GSM8K row (invalid_json)",
        True,
    ),
    ("export of a missing directory", ["export", "nowhere", "out"], "nowhere: no such checkpoint directory", True),
    (
        "export of a directory without checkpoints",
        ["export", "empty", "out"],
        "empty: no checkpoint (step_N/) in this directory",
        False,
    ),
    (
        "eval without the SFT model",
        ["eval", TINY, "sft.output_dir=no-sft"],
        "sft.output_dir: no SFT model at no-sft",
        False,
    ),
    (
        "model directory without config.json",
        ["eval", TINY, "ppo.init_from_sft=false", "policy.model.path=empty"],
        "policy.model.path: empty is not an HF model directory (no config.json)",
        False,
    ),
    (
        "unreadable model directory",
        ["sft", TINY, "policy.model.path=broken-model", "sft.output_dir=sft"],
        "policy.model.path: cannot read broken-model/config.json: OSError:",
        False,
    ),
    ("plot of a missing log directory", ["plot", "nolog"], "nolog: no metrics.jsonl", False),
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    (root / "orphan.yaml").write_text("defaults: gone.yaml\n")
    (root / "bad.jsonl").write_text("{broken json\n" + json.dumps({"question": "Q"}) + "\n")
    (root / "mixed.jsonl").write_text(GOOD_ROW + "\n{broken json\n")
    (root / "empty").mkdir()
    (root / "broken-model").mkdir()
    (root / "broken-model" / "config.json").write_text("{not json")
    return root


# Found in a spawned rank: only a real process tree shows what reaches the user. The other cases fail before any
# rank starts, in the CLI's own process, so they run through ``dtppo.cli.main`` in this one (the same code path).
IN_A_RANK = {"bad row refused (PPO, in the rank)"}


def _dtppo(args: list[str], cwd: Path, debug: bool) -> subprocess.CompletedProcess:
    """``dtppo ARGS`` as a process tree (tests.support.cli's forked runner: its own stdout and stderr, its ranks
    spawned), with ``DTPPO_DEBUG`` set or not."""
    env = {"DTPPO_DEBUG": "1" if debug else ""}
    return run_cli(args, cwd, timeout=600, check=False, env=env)


def _exit_and_output(case: str, args: list[str], cwd: Path, debug: bool, monkeypatch, capsys) -> tuple[int, str, str]:
    if case in IN_A_RANK:
        proc = _dtppo(args, cwd, debug)
        return proc.returncode, proc.stdout, proc.stderr
    monkeypatch.delenv("DTPPO_DEBUG", raising=False)
    if debug:
        monkeypatch.setenv("DTPPO_DEBUG", "1")
    return run_cli_in_process(args, cwd, monkeypatch, capsys)


@pytest.mark.parametrize("case, args, fragment, _", CASES, ids=[c for c, *_ in CASES])
def test_an_input_failure_is_one_line_and_exit_2(workdir, case, args, fragment, _, monkeypatch, capsys):
    code, out, err = _exit_and_output(case, args, workdir, False, monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2, f"{case}: exit {code}\n{err}"
    assert len(lines) == 1 and lines[0].startswith("dtppo: ") and fragment in lines[0], f"{case}:\n{err}"
    assert "Traceback" not in out + err


@pytest.mark.parametrize(
    "case, args, fragment", [(c, a, f) for c, a, f, debug in CASES if debug], ids=[c for c, *_, debug in CASES if debug]
)
def test_dtppo_debug_adds_the_traceback(workdir, case, args, fragment, monkeypatch, capsys):
    code, _, err = _exit_and_output(case, args, workdir, True, monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2, f"{case}: exit {code}\n{err}"
    assert lines[0] == "Traceback (most recent call last):" and fragment in lines[-1], f"{case}:\n{err}"


def test_the_sweep_is_broad():
    assert len(CASES) >= 10 and {a[0] for _, a, _, _ in CASES} == {"sft", "ppo", "eval", "export", "plot"}


def test_a_model_with_pickled_weights_is_refused_before_anything_is_unpickled(qwen_dir, tmp_path, monkeypatch, capsys):
    # Before: transformers unpickled pytorch_model.bin, and torch's refusal of the payload came in terminal colour
    # codes, naming no key and suggesting to load the file anyway
    marker = tmp_path / "payload-ran"
    with_pickled_weights(qwen_dir, tmp_path / "model", marker)
    code, out, err = run_cli_in_process(
        ["ppo", TINY, "ppo.init_from_sft=false", "policy.model.path=model"], tmp_path, monkeypatch, capsys
    )
    assert code == 2 and "Traceback" not in out + err, err
    assert err.splitlines() == [
        "dtppo: config error: policy.model.path: model: no *.safetensors weights (found: pytorch_model.bin); the "
        "policy is loaded from safetensors only, never unpickled: convert it where you trust the file "
        "(from_pretrained, then save_pretrained writes safetensors)"
    ]
    assert not marker.exists()  # and it would be, were the file unpickled: tests/unit/launch/test_model_checks.py


def test_a_model_without_a_tokenizer_is_named_even_with_a_chat_template_added(qwen_dir, tmp_path, monkeypatch, capsys):
    # Before: "no chat template"; with the template added as that line said, every prompt encoded to no tokens and
    # the first rollout ended in a 75-line traceback
    without_tokenizer(qwen_dir, tmp_path / "model", QWEN_TEMPLATE)
    code, out, err = run_cli_in_process(
        ["ppo", TINY, "ppo.init_from_sft=false", "policy.model.path=model"], tmp_path, monkeypatch, capsys
    )
    assert code == 2 and "Traceback" not in out + err, err
    assert err.splitlines() == [
        "dtppo: config error: policy.model.path: model holds no tokenizer (none of tokenizer.json, tokenizer.model, "
        "vocab.json + merges.txt, vocab.txt; tokenizer_config.json alone has no vocabulary), so every prompt would "
        "encode to no tokens: copy the tokenizer files of the model it was trained from into it"
    ]


def test_ppo_refuses_an_sft_model_below_its_recipes_floor_in_one_line(workdir, monkeypatch, capsys):
    # A reused SFT directory whose saved results are below the demo recipe's floor: exit 5 before any rank starts
    # or any model loads (the directory holds no weights, so getting further would fail differently).
    sft = workdir / "weak-sft"
    sft.mkdir()
    (sft / "config.json").write_text("{}")
    (sft / "sft_results.json").write_text(json.dumps({"sft/accuracy": 0.176, "sft/steps": 400.0}))
    demo = str(Path(TINY).with_name("tiny-math-critic-cpu.yaml"))
    code, out, err = run_cli_in_process(["ppo", demo, f"sft.output_dir={sft}"], workdir, monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 5, err
    assert len(lines) == 1 and lines[0].startswith("dtppo: ") and "17.6 %" in lines[0] and "90.0 %" in lines[0], lines
    assert "Traceback" not in out + err
    control = _dtppo(
        ["ppo", demo, f"sft.output_dir={sft}", "sft.min_accuracy=0.1", "ppo.max_num_steps=1"], workdir, debug=False
    )
    assert control.returncode != 5 and "sft.min_accuracy" not in control.stderr  # a lower floor lets it go on
