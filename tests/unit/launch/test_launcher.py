"""Where a run's ranks start and what every rank runs around its work (``dtppo.launch.launcher``), in one process: a
stop is one line on stderr and its exit code (a traceback only with DTPPO_DEBUG=1), a spawned rank's stop becomes
this process's exit code, the launcher is shut down whatever happened, and local paths are anchored at this working
directory for ranks that run elsewhere. Ranks in processes of their own: tests/functional/test_multirank_cli.py; on
Ray: tests/functional/test_ray.py."""

import pytest

from dtppo.config import ClusterConfig
from dtppo.errors import CheckpointError, InputError, NonFiniteError, RunStopped
from dtppo.launch.launcher import DEBUG_ENV, LocalLauncher, absolute_paths, build_launcher, launch, stops_reported


def test_a_stop_is_one_line_on_stderr_and_its_exit_code(capsys, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    with pytest.raises(SystemExit) as exit_:
        with stops_reported():
            raise CheckpointError("step_3: manifest.json is missing")
    assert exit_.value.code == 4
    assert capsys.readouterr().err == "dtppo: error: step_3: manifest.json is missing\n"


def test_with_debug_the_stop_comes_with_its_traceback(capsys, monkeypatch):
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(SystemExit):
        with stops_reported():
            raise InputError("data.train.path: missing")
    err = capsys.readouterr().err
    assert "Traceback" in err and err.endswith("dtppo: error: data.train.path: missing\n")


class _Launcher:
    world_size = 2

    def __init__(self, raises: BaseException | None):
        self.raises, self.shut = raises, False

    def run(self, fn, *args):
        if self.raises is not None:
            raise self.raises
        fn(*args)

    def shutdown(self):
        self.shut = True


class _RankExited(Exception):
    """What a process launcher raises when a spawned rank exited: its exit code."""

    def __init__(self, exit_code):
        super().__init__(f"rank 1 exited with {exit_code}")
        self.exit_code = exit_code


def test_launch_turns_a_spawned_ranks_stop_into_its_error_reported_and_always_shuts_down():
    ran = []
    ok = _Launcher(None)
    launch(ok, ran.append, "work")
    assert ran == ["work"] and ok.shut
    stopped = _Launcher(_RankExited(NonFiniteError.exit_code))
    with pytest.raises(NonFiniteError, match="^a rank stopped the run with exit code 3; its line is above$") as err:
        launch(stopped, ran.append)
    assert err.value.reported and stopped.shut  # the rank printed its line: the command line exits 3 without one
    crashed = _Launcher(_RankExited(-11))  # not a stop: the error itself goes on
    with pytest.raises(_RankExited):
        launch(crashed, ran.append)
    own = _Launcher(RunStopped("generation rank 0 was killed"))  # the launcher's own stop: main() prints it
    with pytest.raises(RunStopped):
        launch(own, ran.append)
    assert crashed.shut and own.shut


def test_ranks_on_this_machine_are_launched_locally_with_the_rank_entries_preloaded():
    launcher = build_launcher(ClusterConfig(workers_per_node=2))
    assert isinstance(launcher, LocalLauncher) and (launcher.world_size, launcher.generation_ranks) == (2, 0)
    assert "dtppo.ppo.entry" in launcher.preload


def test_paths_are_anchored_here_outputs_always_inputs_only_when_they_exist(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.jsonl").write_text("")
    (tmp_path / "rewards.py").write_text("")
    tree = {
        "logger": {"log_dir": "logs"},
        "data": {"train": {"path": "data.jsonl"}, "validation": {"path": "elsewhere.jsonl"}},
        "policy": {"model": {"path": "Qwen/Qwen2.5-0.5B"}},
        "reward": {"functions": ["gsm8k", "rewards.py:f", "pkg.mod:g"]},
    }
    out = absolute_paths(tree)
    assert out["logger"]["log_dir"] == str(tmp_path / "logs")
    assert "checkpoint_dir" not in out["checkpointing"]  # an output the recipe leaves to its default
    assert out["data"]["train"]["path"] == str(tmp_path / "data.jsonl")
    assert out["data"]["validation"]["path"] == "elsewhere.jsonl"  # not here: left as written
    assert out["policy"]["model"]["path"] == "Qwen/Qwen2.5-0.5B"  # a hub name stays a name
    assert out["reward"]["functions"] == ["gsm8k", f"{tmp_path / 'rewards.py'}:f", "pkg.mod:g"]
    assert tree["logger"]["log_dir"] == "logs"  # the caller's tree is not changed
