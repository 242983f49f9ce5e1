"""What step rewards cost in the reward phase of the tiny recipe: the phase as the trainer runs it
(``ppo.reward_phase.rewarded``: decode, score, place the steps, add the rewards to the batch) on 64 answers written
as the SFT data writes them (tiny_math's worked solutions, character tokens), with the recipe's 2 scoring processes,
with one, and in-process. Three pairs of arms, each pair interleaved call by call: the verifier's score as an
outcome against the same score as a step at the answer's end (the mechanism's cost: checking, merging and placing
steps; goal at most 1.1x), the verifier alone against the verifier with ``arithmetic_steps`` (what a step scorer
adds by its own work), and the step form with its tokens measured after the scores against the same measured while
the scoring processes work (what that overlap saves; one process on 2 cores leaves this one a core). Each pair is
measured ``--repeats`` times with fresh scoring processes: the ratio moves more between repeats than within one
(where the processes land on a shared machine's cores). Writes bench/results/perf/reward_phase.json.

    python -m bench.perf.reward_phase [--calls 300] [--repeats 3] [--workers 2 1 0] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch

from bench.common.paths import PERF, REPO
from bench.common.record import command_line, write_record
from dtppo.config import load
from dtppo.data.tiny_math import make_problem
from dtppo.models.tokenizer import build_char_tokenizer
from dtppo.ppo.reward_phase import rewarded
from dtppo.ppo.sample_filters import overlong_penalties
from dtppo.rewards.rewarder import Rewarder
from dtppo.rewards.verifiers.gsm8k import gsm8k_reward
from dtppo.types import Experience

GOAL = 1.10  # the same reward as a step at most this many times the phase with it as an outcome
HERE = REPO / "bench" / "perf" / "reward_phase.py"
ARMS = {
    "outcome": ([f"{HERE}:verifier_outcome", "gsm8k"], [1.0, 0.0]),
    "the same as a step": ([f"{HERE}:verifier_step", "gsm8k"], [1.0, 0.0]),
    "verifier": (["gsm8k"], [1.0]),
    "verifier + arithmetic_steps": (["gsm8k", "arithmetic_steps"], [1.0, 0.5]),
    "the same, measured after the scores": ([f"{HERE}:verifier_step", "gsm8k"], [1.0, 0.0]),
}
# Its rewarder is told before each call that its last batch had no step: the phase then measures the tokens after
# the scores come (as on a run's first batch) instead of while the scoring processes work
AFTER_THE_SCORES = "the same, measured after the scores"

PAIRS = (
    ("outcome", "the same as a step"),
    ("verifier", "verifier + arithmetic_steps"),
    (AFTER_THE_SCORES, "the same as a step"),
)


def verifier_outcome(completions: list[str], answer: list[str], **kwargs) -> list[float]:
    return [gsm8k_reward(c, a) for c, a in zip(completions, answer)]


def verifier_step(completions: list[str], answer: list[str], **kwargs) -> list[list[tuple[int, float]]]:
    return [[(len(c), gsm8k_reward(c, a))] if c else [] for c, a in zip(completions, answer)]


def batch(recipe) -> tuple[Experience, list]:
    """64 problems and their worked solutions as responses (cut at max_new_tokens), after a fixed prompt."""
    tok, rng = build_char_tokenizer(), random.Random(0)
    problems = [make_problem(rng, recipe.data.tiny_math) for _ in range(recipe.ppo.num_prompts_per_step)]
    prompt, width = 24, recipe.policy.generation.max_new_tokens
    ids = torch.full((len(problems), prompt + width), tok.pad_token_id)
    response = torch.zeros(ids.shape)
    for b, p in enumerate(problems):
        answer = tok.encode(p.solution, add_special_tokens=False)[:width]
        ids[b, :prompt] = 5
        ids[b, prompt : prompt + len(answer)] = torch.tensor(answer)
        response[b, prompt : prompt + len(answer)] = 1.0
    attention = (ids != tok.pad_token_id).long()
    return Experience(
        ids, attention, response, torch.zeros(ids.shape), torch.zeros(len(problems), dtype=torch.bool)
    ), problems


def phase_times(arms: tuple[str, ...], workers: int, calls: int) -> dict[str, list[float]]:
    """Seconds per reward phase of each of ``arms``, called in turn ``calls`` times after 10 warm-up rounds, in
    alternating order (only their scoring processes alive: other arms' would compete for the cores)."""
    recipe = load(str(REPO / "recipes" / "tiny-math-cpu.yaml"), [])
    experience, problems = batch(recipe)
    tok = build_char_tokenizer()
    rewarders = {}
    for name in arms:
        functions, weights = ARMS[name]
        overrides = [f"reward.functions=[{', '.join(functions)}]", f"reward.weights={weights}"]
        cfg = load(str(REPO / "recipes" / "tiny-math-cpu.yaml"), [*overrides, f"reward.num_workers={workers}"])
        rewarders[name] = Rewarder(cfg.reward, None, cfg.cluster.backend, None)
    times = {name: [] for name in arms}
    try:
        for call in range(calls + 10):
            # ABBA: the second call of a pair runs a few percent slower (measured: an arm against itself, 1.03x)
            for name, rewarder in list(rewarders.items())[:: 1 if call % 2 else -1]:
                if name == AFTER_THE_SCORES:
                    rewarder.gave_steps = False
                start = time.perf_counter()
                rewarded(rewarder, tok, experience, problems, overlong_penalties(experience, recipe))
                if call >= 10:
                    times[name].append(time.perf_counter() - start)
    finally:
        for rewarder in rewarders.values():
            rewarder.close()
    return times


def rows_of(repeats: list[dict[str, list[float]]], workers: int, command: str) -> list[dict]:
    """One row per arm; the second of the pair carries its ratio to the first: in each repeat the median over rounds
    of their calls' ratio (a round's calls are adjacent, so the machine's drift cancels), and the median of those,
    held against the goal for the step form."""
    base, name = list(repeats[0])  # the pair, in its order
    pooled = {arm: [t for times in repeats for t in times[arm]] for arm in (base, name)}
    median = {arm: statistics.median(times) for arm, times in pooled.items()}
    rows = [{"workers": workers, "arm": n, "ms_median": 1e3 * m, "command": command} for n, m in median.items()]
    ratios = [statistics.median(a / b for a, b in zip(times[name], times[base])) for times in repeats]
    rows[1] |= {"against": base, "ratio": statistics.median(ratios), "ratio_repeats": ratios}
    rows[1]["ratio_of_medians"] = median[name] / median[base]
    if base == "outcome":
        rows[1] |= {"goal": GOAL, "meets_goal": rows[1]["ratio"] <= GOAL}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 1, 0])
    parser.add_argument("--out", default=str(PERF / "reward_phase.json"))
    args = parser.parse_args()
    command, load_before, rows = command_line(), os.getloadavg(), []
    print(f"reward phase of the tiny recipe, 64 answers; {args.repeats} x {args.calls} calls per arm, interleaved")
    print(f"{'scoring processes':<19}{'arm':<37}{'ms':>8}{'ratio':>8}  repeats")
    for workers in args.workers:
        # scored in-process there is no wait to measure the tokens in: the overlap's pair would compare equals
        for pair in PAIRS if workers else PAIRS[:2]:
            repeats = [phase_times(pair, workers, args.calls) for _ in range(args.repeats)]
            for row in rows_of(repeats, workers, command):
                each = " ".join(f"{r:.3f}" for r in row.get("ratio_repeats", []))
                ratio = f"{row['ratio']:>8.3f}  {each}" if "ratio" in row else ""
                print(f"{workers:<19}{row['arm']:<37}{row['ms_median']:>8.2f}{ratio}")
                rows.append(row)
    meta = {
        "args": vars(args),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "shared_machine": True,
    }
    write_record(args.out, {"meta": meta, "rows": rows}, command, indent=2)


if __name__ == "__main__":
    main()
