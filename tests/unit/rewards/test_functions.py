"""Reward functions in TRL's convention: the spec loader, argument checks, result checks, the scoring pool with a
user's functions, and the weighted total (``dtppo.rewards``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dtppo.config import TASK_VERIFIERS, RewardConfig, from_dict
from dtppo.config.reward_spec import BUILTINS, parse_spec
from dtppo.data.problem import Problem
from dtppo.rewards import RewardFunctionError, reward_function
from dtppo.rewards.functions import _BUILTIN_FUNCTIONS, call_function, check_arguments, load_functions
from dtppo.rewards.rewarder import Rewarder
from dtppo.rewards.scoring import RewardScorer
from dtppo.usercode.given import GivenInputs

USER_FILE = """
import json, os

def trl_style(completions, **kwargs):
    return [float(len(c)) for c in completions]

def with_columns(prompts, completions, bonus, **kwargs):
    with open(os.environ["RECORD"], "a") as fh:
        fh.write(json.dumps({"prompts": prompts, "completions": completions, "bonus": bonus,
                             "keys": sorted(kwargs)}) + "\\n")
    return [b if c else None for b, c in zip(bonus, completions)]

def raises(completions, **kwargs):
    raise ValueError("boom")

def short(completions, **kwargs):
    return [1.0]

def text_score(completions, **kwargs):
    return ["high"] * len(completions)

def nan_second(completions, **kwargs):
    return [1.0, float("nan")] + [0.0] * (len(completions) - 2)

def inf_first(completions, **kwargs):
    return [float("inf")] * len(completions)

def as_numpy(completions, **kwargs):
    import numpy
    return numpy.ones(len(completions)) * 0.5

NOT_CALLABLE = 3
"""


@pytest.fixture
def user_file(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "my_rewards.py"
    path.write_text(USER_FILE)
    monkeypatch.setenv("RECORD", str(tmp_path / "record.jsonl"))
    return path


def test_a_given_function_is_found_by_its_name():
    given = GivenInputs((("mine", len),))
    assert reward_function("mine", given) is len
    assert [fn for _, fn in load_functions(["gsm8k", "mine"], given)][1] is len
    with pytest.raises(RewardFunctionError, match="'yours' is neither a built-in"):
        reward_function("yours", given)


def test_specs_parse_to_their_kind_and_metric_name():
    assert (parse_spec("gsm8k").kind, parse_spec("gsm8k").name) == ("builtin", "gsm8k")
    assert (parse_spec("a/b.py:f").kind, parse_spec("a/b.py:f").name) == ("file", "f")
    assert (parse_spec("pkg.mod:g").kind, parse_spec("pkg.mod:g").target) == ("module", "pkg.mod")
    assert (parse_spec("mine").kind, parse_spec("mine").name) == ("given", "mine")  # a function given in Python
    for bad in ["file.py", ":f", "pkg.mod:", "pkg.mod:not-a-name", "bad module:f", "not a name"]:
        with pytest.raises(ValueError):
            parse_spec(bad)


def test_the_built_in_names_are_the_built_in_functions_and_every_task_verifier_is_one():
    """``BUILTINS`` (what the config accepts) and the loader's table cannot drift apart, and no task defaults to a
    verifier the loader lacks."""
    assert set(_BUILTIN_FUNCTIONS) == set(BUILTINS) and len(BUILTINS) == len(set(BUILTINS))
    assert {verifier for verifier in TASK_VERIFIERS.values() if verifier is not None} <= set(BUILTINS)


def test_the_loader_finds_files_modules_and_builtins(user_file):
    assert reward_function(f"{user_file}:trl_style")(completions=["ab", "c"]) == [2.0, 1.0]
    assert reward_function("json:dumps") is json.dumps
    assert reward_function("gsm8k")(prompts=["q"], completions=["#### 4"], answer=["4"]) == [1.0]


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("missing.py:f", "file not found: missing.py"),
        ("{file}:absent", "has no 'absent'"),
        ("{file}:NOT_CALLABLE", "NOT_CALLABLE is a int, not callable"),
        ("no_such_module_xyz:f", "cannot import no_such_module_xyz: ModuleNotFoundError"),
        (
            "gsm9k",
            "'gsm9k' is neither a built-in (gsm8k, math, arithmetic_steps, arithmetic_first_error) nor a function",
        ),
    ],
)
def test_loader_errors_name_the_spec(user_file, spec, fragment):
    spec = spec.format(file=user_file)
    with pytest.raises(RewardFunctionError) as err:
        reward_function(spec)
    assert fragment in str(err.value) and "\n" not in str(err.value)
    assert err.value.exit_code == 2


def test_a_file_that_fails_to_import_is_named(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import not_a_module_at_all\n")
    with pytest.raises(RewardFunctionError, match=r"importing .*broken\.py raised ModuleNotFoundError"):
        reward_function(f"{path}:f")


def test_required_arguments_must_be_columns(user_file):
    fn = reward_function(f"{user_file}:with_columns")
    check_arguments("with_columns", fn, ["bonus", "other"])
    with pytest.raises(RewardFunctionError, match="needs a column 'bonus' that the rows do not have"):
        check_arguments("with_columns", fn, ["other"])
    check_arguments("trl", reward_function(f"{user_file}:trl_style"), [])  # **kwargs takes anything
    with pytest.raises(RewardFunctionError, match="needs a column 'answer'"):
        check_arguments("gsm8k", reward_function("gsm8k"), [])  # a built-in verifier needs a reference


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("raises", "raised ValueError: boom (on a chunk of samples 10..12)"),
        ("short", "returned 1 scores for 3 samples"),
        (
            "text_score",
            "returned 'high' (str), not a number, None or a list of (end, reward) for sample 10 (prompt 'p0')",
        ),
        ("nan_second", "returned nan for sample 11 (prompt 'p1')"),
        ("inf_first", "returned inf for sample 10"),
    ],
)
def test_bad_results_are_errors_naming_the_function_and_first_bad_sample(user_file, name, fragment):
    spec = f"{user_file}:{name}"
    with pytest.raises(RewardFunctionError) as err:
        call_function(spec, reward_function(spec), ["p0", "p1", "p2"], ["a", "b", "c"], {}, offset=10)
    assert fragment in str(err.value) and spec in str(err.value)


def test_none_and_numpy_results_are_accepted(user_file):
    spec = f"{user_file}:as_numpy"
    assert call_function(spec, reward_function(spec), ["p"] * 2, ["a", "b"], {}) == [0.5, 0.5]
    spec = f"{user_file}:with_columns"
    assert call_function(spec, reward_function(spec), ["p"] * 2, ["a", ""], {"bonus": [2, 3]}) == [2.0, None]


def test_the_pool_runs_a_users_functions_on_exactly_the_rows_columns(user_file, tmp_path):
    """Two scoring processes, chunks of 256: every sample's columns reach the function once, in order."""
    specs = [f"{user_file}:with_columns", f"{user_file}:trl_style"]
    scorer = RewardScorer(RewardConfig(num_workers=2, timeout_s=60), "local", specs)
    n = 600
    prompts, completions = [f"p{i}" for i in range(n)], [f"c{i}" for i in range(n)]
    columns = {"bonus": list(range(n)), "tag": ["x"] * n}
    try:
        with_columns, trl = scorer.score(prompts, completions, columns).scores
    finally:
        scorer.close()
    assert with_columns == [float(i) for i in range(n)] and trl == [float(len(c)) for c in completions]
    records = [json.loads(line) for line in (tmp_path / "record.jsonl").read_text().splitlines()]
    assert sorted(sum((r["bonus"] for r in records), [])) == list(range(n))
    assert all(r["keys"] == ["tag"] for r in records) and len(records) == 3  # 600 samples in chunks of <= 256
    seen = {b: (p, c) for r in records for b, p, c in zip(r["bonus"], r["prompts"], r["completions"])}
    assert seen == {i: (f"p{i}", f"c{i}") for i in range(n)}


def test_a_bad_return_in_the_pool_stops_with_its_name_and_a_raise_fails_its_chunk(user_file):
    """Unusable scores break the contract on every call: the run stops. An exception fails that chunk only (a flaky
    sandbox does that now and then): named, its samples unscored, the other chunks kept."""
    specs = [f"{user_file}:short", f"{user_file}:raises"]
    scorers = [RewardScorer(RewardConfig(num_workers=1, timeout_s=60), "local", [spec]) for spec in specs]
    try:
        with pytest.raises(RewardFunctionError, match="short' returned 1 scores for 3 samples"):
            scorers[0].score(["p0", "p1", "p2"], ["a", "b", "c"], {})
        scored = scorers[1].score(["p0", "p1", "p2"], ["a", "b", "c"], {})
    finally:
        for scorer in scorers:
            scorer.close()
    assert scored.scores == [[None, None, None]] and scored.failed == [True] * 3 and scored.chunks == 1
    (failure,) = scored.failures
    assert (failure.kind, failure.detail, failure.first, failure.size) == ("raised", "ValueError: boom", 0, 3)
    assert failure.describe().endswith("raises' raised ValueError: boom on samples 0..2 (prompt 'p0')")


def _rewarder(functions, weights) -> Rewarder:
    cfg = from_dict(
        {
            "data": {"task": "custom", "train": {"path": "t"}, "validation": {"path": "v"}},
            "reward": {"functions": functions, "weights": weights, "num_workers": 0},
        }
    )
    return Rewarder(cfg.reward, cfg.data.system_prompt, cfg.cluster.backend, device=None)


def test_the_total_is_the_weighted_sum_and_none_counts_as_zero(user_file):
    rewarder = _rewarder([f"{user_file}:with_columns", f"{user_file}:trl_style"], [0.25, -2.0])
    problems = [Problem(question=f"q{i}", solution="", answer=None, columns={"bonus": float(i)}) for i in range(4)]
    scored = rewarder.score(problems, ["aa", "", "b", "cccc"])
    assert scored.scores == {"with_columns": [0.0, None, 2.0, 3.0], "trl_style": [2.0, 0.0, 1.0, 4.0]}
    expected = [0.25 * 0.0 - 4.0, -0.0, 0.25 * 2.0 - 2.0, 0.25 * 3.0 - 8.0]
    assert scored.total.tolist() == pytest.approx(expected, abs=1e-6)
    means = scored.means()
    assert means["with_columns"] == pytest.approx(5.0 / 3)  # None is left out of its function's mean
    assert means["trl_style"] == pytest.approx(7.0 / 4)
    assert means["timed_out_chunks"] == means["failed_samples"] == 0.0 and not scored.failed.any()


def test_conversational_rows_give_trl_style_message_completions(user_file):
    rewarder = _rewarder([f"{user_file}:with_columns"], None)
    messages = [{"role": "user", "content": "hi"}]
    problems = [Problem(question=messages, solution="", answer=None, columns={"bonus": 1.0})]
    rewarder.score(problems, ["hello"])
    record = json.loads(Path(os.environ["RECORD"]).read_text())
    assert record["prompts"] == [messages]
    assert record["completions"] == [[{"role": "assistant", "content": "hello"}]]


def test_the_math_verifier_scores_through_the_pool():
    scorer = RewardScorer(RewardConfig(num_workers=1, timeout_s=60), "local", ["math", "gsm8k"])
    completions = ["so \\boxed{0.5}", "\\boxed{\\frac{2}{4}}", "#### 1/2", "\\boxed{2}", "no answer"]
    try:
        math_scores, gsm8k_scores = scorer.score([None] * 5, completions, {"answer": ["\\frac{1}{2}"] * 5}).scores
    finally:
        scorer.close()
    assert math_scores == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert gsm8k_scores[3:] == [0.0, 0.0]
