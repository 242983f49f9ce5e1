import os
import signal
import time

import torch

from dtppo.config import RewardConfig
from dtppo.data.answers import TAIL_CHARS
from dtppo.data.problem import Problem
from dtppo.rewards.rewarder import Rewarder
from dtppo.rewards.scoring import RewardScorer


def _gsm8k(scorer: RewardScorer, responses: list, truths: list) -> torch.Tensor:
    """The scorer's GSM8K-verifier scores as a [B] float32 tensor (a failed chunk's samples as NaN)."""
    (scores,) = scorer.score([None] * len(responses), responses, {"answer": truths}).scores
    return torch.tensor([float("nan") if s is None else s for s in scores], dtype=torch.float32)


def _in_this_process(responses: list, truths: list) -> torch.Tensor:
    """The GSM8K verifier's scores computed in this process (``num_workers: 0``): what the pool must match."""
    return _gsm8k(RewardScorer(RewardConfig(num_workers=0), backend="local", specs=["gsm8k"]), responses, truths)


RESPONSES = ["#### 3", "1 + 2 = 3\n#### 3", "#### 4", "\\boxed{\\frac{6}{2}}", "no answer", "#### 3.0", "x"] * 5
TRUTHS = ["3"] * len(RESPONSES)


def test_process_pool_scores_like_the_trainer_process():
    expected = _in_this_process(RESPONSES, TRUTHS)
    assert expected.sum() == 4 * 5
    scorer = RewardScorer(RewardConfig(num_workers=2, timeout_s=60), backend="local", specs=["gsm8k"])
    try:
        assert torch.equal(_gsm8k(scorer, RESPONSES, TRUTHS), expected)
    finally:
        scorer.close()


def test_late_chunks_fail_within_the_time_bound():
    # A 1 ms bound: shipping one 256-pair chunk alone takes longer, so chunks are late on any machine
    # (a bound in the hundreds of ms was met by a fast idle machine and the test could not fail).
    scorer = RewardScorer(RewardConfig(num_workers=2, timeout_s=0.001), backend="local", specs=["gsm8k"])
    try:
        scorer.wait_ready()  # the bound is for scoring; process start-up is waited for, untimed
        many, truths = RESPONSES * 300, TRUTHS * 300
        first_pids = set(scorer.pool.worker_pids)
        start = time.monotonic()
        scored = scorer.score([None] * len(many), many, {"answer": truths})
        assert time.monotonic() - start < 2.0  # the bound, then killing and respawning late processes
        late = [f for f in scored.failures if f.kind == "timed_out"]
        assert late and len(scored.failures) == len(late) and scored.chunks == -(-len(many) // 256)
        # exactly the late chunks' samples have no score
        assert scored.failed == [any(f.first <= i < f.first + f.size for f in late) for i in range(len(many))]
        assert [s is None for s in scored.scores[0]] == scored.failed
        assert "no answer within 0.001 s" in late[0].describe() and "'gsm8k' timed out" in late[0].describe()
        # the stuck processes were replaced (that replacements score right is the next test's check)
        scorer.wait_ready()
        pids = scorer.pool.worker_pids
        assert len(pids) == 2 and set(pids).isdisjoint(first_pids) and len(scorer.pool.workers) == 2
    finally:
        scorer.close()


def test_the_rewarder_counts_each_batchs_failed_chunks_in_its_means():
    """What ``train/reward/timed_out_chunks`` logs: the chunks of that batch that missed the bound, not a running
    total; their samples get no reward (0 in the total, out of every mean)."""
    reward = RewardConfig(functions=("gsm8k",), weights=(1.0,), num_workers=1, timeout_s=0.001)
    rewarder = Rewarder(reward, system_prompt=None, backend="local", device=None)
    problems = [Problem(question="q", solution="", answer=truth) for truth in TRUTHS * 300]
    chunks = -(-len(problems) // 256)
    try:
        first, second = (rewarder.score(problems, RESPONSES * 300) for _ in range(2))
    finally:
        rewarder.close()
    for scored in (first, second):
        means = scored.means()
        assert 0 < means["timed_out_chunks"] <= chunks and means["failed_samples"] == scored.failed.sum()
        assert means["crashed_chunks"] == means["raised_chunks"] == means["out_of_memory_chunks"] == 0
        assert scored.total[scored.failed].eq(0).all()
    window = rewarder.budget.chunks  # both batches belong to the step not yet closed
    assert window == 2 * chunks


def test_pool_survives_its_workers_being_killed():
    """A killed scoring process (OOM killer, crash) is replaced; the next batch still scores right."""
    scorer = RewardScorer(RewardConfig(num_workers=2, timeout_s=60), backend="local", specs=["gsm8k"])
    try:
        scorer.wait_ready()
        for pid in scorer.pool.worker_pids:
            os.kill(pid, signal.SIGKILL)
        assert torch.equal(_gsm8k(scorer, RESPONSES, TRUTHS), _in_this_process(RESPONSES, TRUTHS))
    finally:
        scorer.close()


def test_the_callers_work_runs_while_the_scoring_processes_score(tmp_path):
    """``while_scoring`` runs once the chunks are out: a function that waits for what it writes scores 1 (had it run
    after the scores came, the function would have given up first); scoring in this process never runs it."""
    marker = tmp_path / "written_while_scoring"
    (tmp_path / "waits.py").write_text(
        "import os, time\n"
        "def waits(completions, **kwargs):\n"
        "    deadline = time.monotonic() + 10\n"
        f"    while not os.path.exists({str(marker)!r}) and time.monotonic() < deadline:\n"
        "        time.sleep(0.005)\n"
        f"    return [float(os.path.exists({str(marker)!r}))] * len(completions)\n"
    )
    spec, runs = f"{tmp_path / 'waits.py'}:waits", []

    def write_marker():
        runs.append(len(runs))
        marker.touch()

    scorer = RewardScorer(RewardConfig(num_workers=2, timeout_s=60), backend="local", specs=[spec])
    try:
        (scores,) = scorer.score(["q"] * 4, ["a"] * 4, {}, while_scoring=write_marker).scores
    finally:
        scorer.close()
    assert scores == [1.0] * 4 and runs == [0]
    marker.unlink()
    here = RewardScorer(RewardConfig(num_workers=0), backend="local", specs=["gsm8k"])
    here.score([None], ["#### 3"], {"answer": ["3"]}, while_scoring=write_marker)
    assert runs == [0] and not marker.exists()


def test_a_step_verifier_reads_the_whole_completion():
    """The answer verifiers are sent a completion's last ``TAIL_CHARS`` characters; a step verifier all of it, so
    that its step ends are offsets in the completion (and its early lines are checked)."""
    completion = "1+1=2\n" + "x" * TAIL_CHARS + "\n2+3=5\n#### 5"
    scorer = RewardScorer(RewardConfig(num_workers=0), backend="local", specs=["gsm8k", "arithmetic_steps"])
    answer, steps = scorer.score([None], [completion], {"answer": ["5"]}).scores
    assert answer == [1.0]
    assert [end for end, _ in steps[0]] == [len("1+1=2"), completion.index("2+3=5") + len("2+3=5")]
