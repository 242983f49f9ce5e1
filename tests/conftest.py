import os
import sys

import pytest
import torch

# Two cores: one intra-op thread per test process keeps timings and numerics stable.
torch.set_num_threads(int(os.environ.get("DTPPO_TEST_THREADS", "2")))

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a development checkout may have beside it and a user's clone has not: a test that reads it fails here (the
# tests' processes; .ci/run also runs `make test` in a clone with nothing beside it).
BESIDE = os.path.join(os.path.dirname(REPO), "shared") + os.sep


def _refuse_reads_beside_the_clone(event: str, args: tuple) -> None:
    if event == "open" and args and isinstance(args[0], (str, os.PathLike)):
        path = os.path.abspath(os.fspath(args[0]))
        if path.startswith(BESIDE):
            raise PermissionError(f"a test read {path}: a user's clone has nothing beside it; ship what tests need")


sys.addaudithook(_refuse_reads_beside_the_clone)


@pytest.fixture
def repo_root() -> str:
    return REPO


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory):
    """A Qwen2.5-format model directory (tests/support/hf_fixtures.py); read-only: copy it to change it."""
    from tests.support.hf_fixtures import qwen_format_dir

    return qwen_format_dir(tmp_path_factory.mktemp("qwen-format") / "model")


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    """A Llama-2-format model directory without a pad token (tests/support/hf_fixtures.py)."""
    from tests.support.hf_fixtures import llama_format_dir

    return llama_format_dir(tmp_path_factory.mktemp("llama-format") / "model")


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory):
    """A GPT-2 model directory (tests/support/hf_fixtures.py)."""
    from tests.support.hf_fixtures import gpt2_format_dir

    return gpt2_format_dir(tmp_path_factory.mktemp("gpt2-format") / "model")


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory):
    """family -> a model directory of that family (tests/support/families.py), built once per session; read-only."""
    from tests.support.families import family_dir

    built: dict = {}

    def get(family: str):
        if family not in built:
            built[family] = family_dir(tmp_path_factory.mktemp(f"{family}-format") / "model", family)
        return built[family]

    return get


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With ``DTPPO_REQUIRE_ALL=1`` (set by .ci/run) a skipped test fails the session: where every extra is installed
    (`make venv` installs them all), a skip is an assertion that silently left CI."""
    if os.environ.get("DTPPO_REQUIRE_ALL") != "1" or exitstatus != pytest.ExitCode.OK:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        names = ", ".join(report.nodeid for report in skipped[:5])
        print(f"\nDTPPO_REQUIRE_ALL=1: {len(skipped)} test(s) skipped ({names}): every test must run here", flush=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
