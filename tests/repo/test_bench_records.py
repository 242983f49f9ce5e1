"""Every record under bench/results says what made it and nothing of the machine it ran on: a provenance block
(bench/common/record.py) whose commit is 40 hex digits that git knows (or null, with the reason), commands that run
today (a module, script or make target that exists), and no absolute path anywhere in the JSON, keys included. A
record whose script left bench/ says so (provenance ``retired``: why, and the commit whose checkout holds every
command it names). The checkers are also applied to a deliberately bad record, so each can be seen to fail."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Iterator

import pytest

from bench.common import record
from bench.common.paths import RESULTS
from tests.support.recipes import REPO

RECORDS = sorted(RESULTS.rglob("*.json"))
PROVENANCE = {"command", "commit", "commit_source", "dirty", "utc"}
HEX40 = re.compile(r"[0-9a-f]{40}")
UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
# A path that starts at the root of a machine: at the start of a string or after a non-path character.
ABSOLUTE = re.compile(
    r"(?<![\w.~$/-])/(?:work|home|tmp|root|Users|private|opt|mnt|var|srv|data|scratch|media|Volumes)(?:/|\b)"
)
ENV = re.compile(r"[A-Za-z_]\w*=.*")
MAKE_TARGETS = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.MULTILINE))


def strings(value, where: str = "$") -> Iterator[tuple[str, str]]:
    """(where, text) for every string of a JSON value, dictionary keys included."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield f"{where} (a key)", key
            yield from strings(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from strings(item, f"{where}[{i}]")


def commands(value, where: str = "$") -> Iterator[tuple[str, str]]:
    """(where, command) for every string under a "command" key, the provenance block's included."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "command" and isinstance(item, str):
                yield f"{where}.command", item
            else:
                yield from commands(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from commands(item, f"{where}[{i}]")


def provenance_problems(rec) -> list[str]:
    block = rec.get("provenance") if isinstance(rec, dict) else None
    if not isinstance(block, dict):
        return ["no provenance block"]
    problems = [f"provenance has no {key}" for key in sorted(PROVENANCE - set(block))]
    commit = block.get("commit")
    if commit is None and not str(block.get("commit_source") or "").strip():
        problems.append("commit null without a reason (commit_source)")
    if commit is not None and not (isinstance(commit, str) and HEX40.fullmatch(commit)):
        problems.append(f"commit {commit!r} is not 40 hex digits")
    if block.get("dirty") not in (True, False, None):
        problems.append(f"dirty {block.get('dirty')!r} is neither a boolean nor null")
    if not (isinstance(block.get("utc"), str) and UTC.fullmatch(block["utc"])):
        problems.append(f"utc {block.get('utc')!r} is not YYYY-MM-DDTHH:MM:SSZ")
    return problems


def _module_exists(name: str) -> bool:
    path = name.replace(".", "/")
    return any(
        (root / f"{path}.py").is_file() or (root / path / "__main__.py").is_file() for root in (REPO, REPO / "src")
    )


def runs_today(command: str) -> list[str]:
    """What in ``command`` does not exist today: each ``&&``-joined part after its VAR=value prefix must be
    ``python -m MODULE``, ``python SCRIPT``, ``bash SCRIPT`` or ``make TARGET``."""
    problems = []
    for part in command.split("&&"):
        try:
            words = shlex.split(part)
        except ValueError as error:
            problems.append(f"{part.strip()!r} does not parse: {error}")
            continue
        while words and ENV.fullmatch(words[0]):
            words.pop(0)
        if words[:2] == ["python", "-m"] and len(words) > 2:
            if not _module_exists(words[2]):
                problems.append(f"no module {words[2]}")
        elif words[:1] in (["python"], ["bash"]) and len(words) > 1:
            if not (REPO / words[1]).is_file():
                problems.append(f"no script {words[1]}")
        elif words[:1] == ["make"] and len(words) > 1:
            problems += [f"no make target {t}" for t in words[1:] if not t.startswith("-") and t not in MAKE_TARGETS]
        else:
            problems.append(f"{part.strip()!r} is none of python -m, python, bash or make")
    return problems


def command_problems(rec) -> list[str]:
    return [f"{where}: {problem}" for where, command in commands(rec) for problem in runs_today(command)]


def path_problems(rec) -> list[str]:
    return [f"{where}: {text[:120]!r}" for where, text in strings(rec) if ABSOLUTE.search(text)]


def commits(rec) -> set[str]:
    """The commits a record names: its provenance's, every "commit" key's and those in "reproducible_at" and
    "retired" notes."""
    found = set()
    for where, text in strings(rec):
        if where.endswith(".commit") and text:
            found.add(text)
        elif where.endswith((".reproducible_at", ".retired")):
            found |= set(re.findall(r"\b[0-9a-f]{40}\b", text))
    return found


def retired_at(rec) -> list[str]:
    """The commits a retired record's note names as reproducing it ([] for a record whose script is in bench/)."""
    note = rec.get("provenance", {}).get("retired") if isinstance(rec, dict) else None
    return [] if note is None else re.findall(r"\b[0-9a-f]{40}\b", str(note)) or ["(none)"]


def paths_of(command: str) -> list[str]:
    """The files each part of ``command`` runs (a module as its file or package), for a lookup in a commit."""
    found = []
    for part in command.split("&&"):
        words = [w for w in shlex.split(part) if not ENV.fullmatch(w)]
        if words[:2] == ["python", "-m"]:
            path = words[2].replace(".", "/")
            found.append(
                next(
                    (p for p in (f"{path}.py", f"{path}/__main__.py", f"src/{path}.py") if (REPO / p).is_file()),
                    f"{path}.py",
                )
            )
        elif words[:1] in (["python"], ["bash"]):
            found.append(words[1])
    return found


def missing_at(sha: str, paths: list[str]) -> list[str]:
    """The paths that the commit ``sha`` does not hold."""
    lines = "".join(f"{sha}:{path}\n" for path in paths)
    proc = subprocess.run(["git", "cat-file", "--batch-check"], input=lines, cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return [line.split(" ")[0].split(":", 1)[1] for line in proc.stdout.splitlines() if line.endswith(" missing")]


def unknown_commits(shas: set[str]) -> set[str]:
    lines = "".join(f"{sha}^{{commit}}\n" for sha in sorted(shas))
    proc = subprocess.run(["git", "cat-file", "--batch-check"], input=lines, cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return {line.split("^", 1)[0] for line in proc.stdout.splitlines() if line.endswith(" missing")}


def no_history() -> str | None:
    """Why this checkout cannot look the records' commits up (no git, a tarball, a shallow clone), or None."""
    try:
        proc = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True, text=True)
    except OSError as error:
        return f"git does not run: {error}"
    if proc.returncode != 0:
        return "not a git checkout"
    return "a shallow clone: the records' commits may lie outside it" if proc.stdout.strip() == "true" else None


def _load(path) -> dict:
    return json.loads(path.read_text())


def _ids(paths) -> list[str]:
    return [str(p.relative_to(RESULTS)) for p in paths]


def test_there_are_records():
    assert len(RECORDS) >= 50 and {p.parent.name for p in RECORDS} == {"device", "learning", "perf", "reliability"}


@pytest.mark.parametrize("path", RECORDS, ids=_ids(RECORDS))
def test_a_record_has_its_provenance_and_commands_that_run_today(path):
    rec = _load(path)
    assert provenance_problems(rec) == []
    if retired_at(rec):
        assert retired_at(rec) != ["(none)"], "a retired record names the commit that reproduces it"
    else:
        assert command_problems(rec) == [], "commands must be what runs today (python -m bench.<kind>.<name> ...)"


@pytest.mark.parametrize("path", RECORDS, ids=_ids(RECORDS))
def test_a_record_holds_no_absolute_path(path):
    assert path_problems(_load(path)) == [], "bench.common.record.relative writes them relative to the repository"


def test_a_retired_record_names_a_commit_that_holds_its_commands():
    reason = no_history()
    if reason:
        pytest.skip(reason)
    retired = {path.name: (_load(path), retired_at(_load(path))) for path in RECORDS if retired_at(_load(path))}
    assert len(retired) >= 5
    for name, (rec, shas) in retired.items():
        paths = sorted({p for _, command in commands(rec) for p in paths_of(command)})
        assert any(missing_at(sha, paths) == [] for sha in shas), f"{name}: no named commit holds {paths}"


def test_every_commit_a_record_names_is_in_the_history():
    reason = no_history()
    if reason:
        pytest.skip(reason)
    named = {sha: path for path in RECORDS for sha in commits(_load(path))}
    assert len(named) > 10
    assert {named[sha].name: sha for sha in unknown_commits(set(named))} == {}


BAD = {
    "provenance": {
        "command": "python bench/rollout.py --threads 1",
        "commit": "7aa90ac",
        "dirty": "yes",
        "utc": "today",
    },
    "rows": [
        {"command": "python -m bench.perf.no_such_bench"},
        {"command": "bash bench/gpu.sh --out /root/out/gpu.json"},
        {"command": "make no-such-target && python -m dtppo ppo recipes/tiny-math-cpu.yaml"},
        {"recipe": "/work/main/recipes/tiny-math-cpu.yaml", "/home/me/runs": "data.train.path=/tmp/x.jsonl"},
    ],
}


def test_the_checkers_see_each_problem_of_a_bad_record():
    """Negative control: every kind of problem the tests above look for, each seen where it is."""
    assert provenance_problems(BAD) == [
        "provenance has no commit_source",
        "commit '7aa90ac' is not 40 hex digits",
        "dirty 'yes' is neither a boolean nor null",
        "utc 'today' is not YYYY-MM-DDTHH:MM:SSZ",
    ]
    assert provenance_problems({"rows": []}) == ["no provenance block"]
    unexplained = {
        "command": "python -m bench.perf.parity",
        "commit": None,
        "dirty": None,
        "utc": "2026-12-06T00:00:00Z",
    }
    assert provenance_problems({"provenance": unexplained | {"commit_source": ""}}) == [
        "commit null without a reason (commit_source)"
    ]
    assert provenance_problems({"provenance": unexplained | {"commit_source": "no git history: a tarball"}}) == []
    assert command_problems(BAD) == [
        "$.provenance.command: no script bench/rollout.py",
        "$.rows[0].command: no module bench.perf.no_such_bench",
        "$.rows[1].command: no script bench/gpu.sh",
        "$.rows[2].command: no make target no-such-target",
    ]
    assert [p.split(":")[0] for p in path_problems(BAD)] == [
        "$.rows[1].command",
        "$.rows[3].recipe",
        "$.rows[3] (a key)",
        "$.rows[3]./home/me/runs",
    ]


def test_an_unknown_commit_is_seen():
    """Negative control of the history check: a made-up commit is missing, the checked-out one is not."""
    reason = no_history()
    if reason:
        pytest.skip(reason)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert unknown_commits({"0" * 40, head}) == {"0" * 40}


def test_a_written_record_passes_the_checks(tmp_path):
    """bench.common.record.write_record gives a record these tests accept: provenance first, paths relative."""
    out = tmp_path / "perf" / "x.json"
    payload = {"recipe": str(REPO / "recipes" / "tiny-math-cpu.yaml"), "log": f"{REPO}/runs/x/log", "value": 0.5}
    written = record.write_record(out, payload, "python -m bench.perf.parity")
    rec = _load(out)
    assert rec == written and list(rec) == ["provenance", "recipe", "log", "value"]
    assert rec["recipe"] == "recipes/tiny-math-cpu.yaml" and rec["log"] == "runs/x/log" and rec["value"] == 0.5
    assert provenance_problems(rec) == [] and command_problems(rec) == [] and path_problems(rec) == []
    assert not list(out.parent.glob("*.tmp"))  # written whole, then renamed
    record.write_record(out, rec | {"value": 0.7})  # an earlier record's block is replaced, not kept
    assert _load(out)["value"] == 0.7 and list(_load(out)) == list(rec)


def test_without_git_the_commit_is_null_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "REPO", tmp_path)  # a folder that is no git checkout: a tarball's
    block = record.provenance("python -m bench.perf.parity")
    assert block["commit"] is None and block["dirty"] is None and block["commit_source"].startswith("no git history")
    assert provenance_problems({"provenance": block}) == []

    def missing(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(record.subprocess, "run", missing)
    assert record.provenance("x")["commit_source"].startswith("no git history: git did not run")


def test_the_command_is_the_module_run_with_its_arguments_quoted_and_relative(monkeypatch):
    for name in record.KERNEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    args = ["--out", str(REPO / "bench" / "results" / "perf" / "x.json"), "--label", "bf16 (before)"]
    command = "python -m bench.perf.sampling --out bench/results/perf/x.json --label 'bf16 (before)'"
    assert record.command_line("bench.perf.sampling", args) == command
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # the kernels change the figures: the command names them
    assert record.command_line("bench.perf.sampling", args) == "ATEN_CPU_CAPABILITY=avx2 " + command


def test_a_retired_record_without_its_commit_or_its_script_is_seen():
    """Negative control of the retired records' checks: a note naming no commit, a commit that lacks the script."""
    assert retired_at({"provenance": {"retired": "gone"}}) == ["(none)"] and retired_at({"provenance": {}}) == []
    assert paths_of("ATEN_CPU_CAPABILITY=avx2 python -m bench.learning.critic alignment && bash bench/gpu.sh") == [
        "bench/learning/critic.py",
        "bench/gpu.sh",
    ]
    reason = no_history()
    if reason:
        pytest.skip(reason)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert missing_at(head, ["bench/perf/no_such_bench.py", "bench/common/record.py"]) == [
        "bench/perf/no_such_bench.py"
    ]
