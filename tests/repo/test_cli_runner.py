"""The tests' CLI runner (tests/support/cli.py) shows what a user sees: a command forked from the CLI server exits
with the same code and writes the same stdout and stderr as ``python -m dtppo`` in a fresh interpreter, and a command
whose environment changes what the stack reads at import runs in a fresh interpreter."""

import os
import subprocess

import pytest

from tests.support import cli
from tests.support.recipes import TINY


@pytest.mark.slow  # a fresh interpreter per command (the point of the comparison)
@pytest.mark.parametrize(
    "args",
    [
        ["ppo", TINY, "ppo.gae.gamma=2"],  # refused by the config: exit 2, one line
        ["export"],  # argparse's usage error: exit 2 on stderr
        ["plot", "--help"],  # exit 0 on stdout
    ],
)
def test_a_forked_command_is_the_fresh_interpreters(args, tmp_path, monkeypatch):
    monkeypatch.delenv("DTPPO_TEST_CLI", raising=False)
    forked = cli.run_cli(args, tmp_path, check=False)
    monkeypatch.setenv("DTPPO_TEST_CLI", "subprocess")
    fresh = cli.run_cli(args, tmp_path, check=False)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.stdout or forked.stderr  # the comparison saw output


def test_import_time_variables_and_the_switch_choose_a_fresh_interpreter(monkeypatch):
    monkeypatch.delenv("DTPPO_TEST_CLI", raising=False)
    base = dict(os.environ)
    assert cli._forks(base | {"DTPPO_TEST_NONFINITE": "policy:0"})  # read when used: a fork sees it
    assert not cli._forks(base | {"OMP_NUM_THREADS": "7" if base.get("OMP_NUM_THREADS") != "7" else "3"})
    assert not cli._forks(base | {"ATEN_CPU_CAPABILITY": "avx2" if base.get("ATEN_CPU_CAPABILITY") != "avx2" else ""})
    assert not cli._forks(base | {"DTPPO_TEST_CLI": "subprocess"})


def test_a_command_past_its_timeout_raises_and_the_server_goes_on(tmp_path, monkeypatch):
    monkeypatch.delenv("DTPPO_TEST_CLI", raising=False)
    hang = tmp_path / "hang.py"
    hang.write_text("import time\n\ndef reward(prompts, completions, **_):\n    time.sleep(60)\n")
    args = ["ppo", TINY, "ppo.init_from_sft=false", "ppo.max_num_steps=1", f"reward.functions=[{hang}:reward]"]
    with pytest.raises(subprocess.TimeoutExpired):
        cli.run_cli(args, tmp_path, timeout=1)
    assert cli.run_cli(["ppo", TINY, "ppo.gae.gamma=2"], tmp_path, check=False).returncode == 2
