"""The command line (``dtppo.cli``) in this process, for what needs no run: its commands and their arguments, a bad
recipe key or an unusable path as one line with exit 2, a plot written where asked. Runs end to end:
tests/functional/test_ppo_cli.py, test_sft_cli.py and test_cli_errors.py."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dtppo.cli import build_parser, main
from tests.support.recipes import TINY


def test_the_commands_and_their_arguments():
    parser = build_parser()
    args = parser.parse_args(["ppo", "r.yaml", "ppo.seed=3", "logger.tensorboard=false"])
    assert (args.command, str(args.recipe), args.overrides) == (
        "ppo",
        "r.yaml",
        ["ppo.seed=3", "logger.tensorboard=false"],
    )
    args = parser.parse_args(["export", "ckpt", "out", "export.dtype=bfloat16"])
    assert (str(args.checkpoint_dir), str(args.out_dir), args.overrides) == ("ckpt", "out", ["export.dtype=bfloat16"])
    args = parser.parse_args(["plot", "a", "b", "--out", "c.png"])
    assert [str(d) for d in args.log_dirs] == ["a", "b"] and str(args.out) == "c.png"
    for command in ("sft", "eval"):
        assert parser.parse_args([command, "r.yaml"]).fn.__name__ == f"cmd_{command}"


def test_no_command_or_an_unknown_one_is_a_usage_error(capsys):
    for argv in ([], ["train", "r.yaml"]):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args(argv)
        assert exit_.value.code == 2
    assert "usage: dtppo" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["sft", "ppo", "eval"])
def test_a_bad_key_is_one_line_naming_it_and_exit_2(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, TINY, "ppo.no_such_key=1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["dtppo: config error: ppo.no_such_key: unknown key"]


def test_an_unusable_path_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["plot", str(tmp_path / "nowhere")])
    assert exit_.value.code == 2
    assert (
        capsys.readouterr().err
        == f"dtppo: error: {tmp_path / 'nowhere'}: no metrics.jsonl (not a dtppo log directory)\n"
    )


def test_plot_writes_its_png_and_says_where(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/reward": 0.5}) + "\n")
    main(["plot", str(tmp_path), "--out", str(tmp_path / "c.png")])
    assert capsys.readouterr().out == f"wrote {tmp_path / 'c.png'}\n" and (tmp_path / "c.png").is_file()


def test_cli_exits_2_naming_the_key_before_any_compute(tmp_path):
    script = Path(sys.executable).with_name("dtppo")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "dtppo"]
    start = time.monotonic()
    proc = subprocess.run(
        [*command, "ppo", str(TINY), "policy.optimizer.lr=-1e-4"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "dtppo: config error: policy.optimizer.lr: must be finite and > 0, got -0.0001"
    ]
    assert list(tmp_path.iterdir()) == []  # no run directory, no SFT output, no checkpoint
    assert time.monotonic() - start < 60
