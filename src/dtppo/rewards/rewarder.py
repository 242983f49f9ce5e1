"""The total reward of a batch: the weighted reward functions (run in the scoring pool) plus the learned reward
model and the process reward model (run in this rank's process, on its device), with each part's scores kept for
the metrics."""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter

import torch

from dtppo.config import RewardConfig
from dtppo.config.reward_spec import (
    BUILTINS,
    FAILED_SAMPLES_NAME,
    FAILURE_KINDS,
    MODEL_NAME,
    PROCESS_MODEL_NAME,
    parse_spec,
)
from dtppo.data.chat import conversation
from dtppo.data.problem import Problem
from dtppo.rewards.failures import ChunkFailure, FailureBudget
from dtppo.rewards.functions import Score, Scores, Steps, check_arguments, load_functions
from dtppo.rewards.scoring import RewardScorer
from dtppo.usercode.given import GivenInputs


@dataclass(frozen=True)
class RewardBreakdown:
    """outcome: [B] float32, the weighted sum of the parts' outcome scores (a None score counts as 0; 0 for a failed
    sample). steps: each sample's step rewards, weighted, as (end, reward) pairs in order of ``end`` (character
    offsets in its completion; () for none and for a failed sample). scores: each part's scores by metric name (the
    functions', the accuracy verifier's when it is not one of them, ``model`` for the RM), one per sample: a
    number, a function's steps, or None (also for a failed sample's functions). failed: [B] bool, the samples of the
    chunks that could not be scored (``failures.ChunkFailure``). failures: this batch's failed chunks per kind
    (``<kind>_chunks``) and their samples (``failed_samples``)."""

    outcome: torch.Tensor
    steps: list[Steps]
    scores: dict[str, Scores]
    failed: torch.Tensor
    failures: dict[str, int]

    @property
    def total(self) -> torch.Tensor:
        """[B] float32: each sample's total reward, its outcome plus its steps."""
        return self.outcome + torch.tensor([sum(r for _, r in s) for s in self.steps], dtype=torch.float32)

    def means(self) -> dict[str, float]:
        """Each part's mean over the samples it applies to (not None; steps count as their sum), a part that applied
        to none left out; and the failure counts, so that a step whose rewards were partly lost shows in its
        record."""
        means = {}
        for name, scores in self.scores.items():
            given = [score_total(s) for s in scores if s is not None]
            if given:
                means[name] = sum(given) / len(given)
        return means | {name: float(n) for name, n in self.failures.items()}

    def take(self, rows: list[int]) -> RewardBreakdown:
        """The samples ``rows`` (indices into this batch); the failure counts stay the whole batch's."""
        scores = {name: [values[i] for i in rows] for name, values in self.scores.items()}
        steps = [self.steps[i] for i in rows]
        return RewardBreakdown(self.outcome[rows], steps, scores, self.failed[rows], self.failures)


def score_total(score: Score) -> float:
    """A sample's score as one number: itself, or the sum of its steps' rewards."""
    return sum(r for _, r in score) if isinstance(score, tuple) else score


def weighted_parts(weighted: list[tuple[float, Scores]], failed: list[bool]) -> tuple[torch.Tensor, list[Steps]]:
    """(outcome [B], steps): the weighted sum of the parts' numbers, and their steps weighted and merged by end, for
    each sample (nothing for a failed one). A part of weight 0 is logged, not rewarded: its steps are no steps (GRPO
    would otherwise count them in its process supervision)."""
    outcome, steps = [], []
    for i, lost in enumerate(failed):
        total, merged = 0.0, []
        for w, part in weighted if not lost else ():
            score = part[i]
            if type(score) is tuple:
                # weight 1 (the usual) keeps the function's own pairs: a step per line of every answer adds up
                merged += score if w == 1.0 else [(end, w * r) for end, r in score] if w != 0.0 else ()
            elif score is not None:
                total += w * score
        if len(merged) > 1:
            merged.sort(key=itemgetter(0))  # stable: steps ending together keep their parts' order
        outcome.append(total)
        steps.append(tuple(merged))
    return torch.tensor(outcome, dtype=torch.float32), steps


def failure_counts(failures: list[ChunkFailure], failed_samples: int) -> dict[str, int]:
    """``RewardBreakdown.failures`` of a batch: its failed chunks per kind, and their samples."""
    kinds = collections.Counter(f.kind for f in failures)
    return {f"{kind}_chunks": kinds[kind] for kind in FAILURE_KINDS} | {FAILED_SAMPLES_NAME: failed_samples}


def concat_breakdowns(parts: list[RewardBreakdown]) -> RewardBreakdown:
    """Batches scored one after the other (dynamic sampling's extra batches) as one: samples in order, failure
    counts added."""
    scores = {name: [s for part in parts for s in part.scores[name]] for name in parts[0].scores}
    failures = {name: sum(part.failures[name] for part in parts) for name in parts[0].failures}
    outcome, failed = torch.cat([part.outcome for part in parts]), torch.cat([part.failed for part in parts])
    return RewardBreakdown(outcome, [s for part in parts for s in part.steps], scores, failed, failures)


def reward_columns(problems: list[Problem]) -> dict[str, list]:
    """Every column of the batch's rows as a keyword list (a row without a column gives None), and the reference as
    ``answer`` where the task has one."""
    names = list(dict.fromkeys(name for p in problems for name in p.columns))
    columns = {name: [p.columns.get(name) for p in problems] for name in names}
    if any(p.answer is not None for p in problems):
        columns["answer"] = [p.answer for p in problems]
    return columns


def check_reward_arguments(
    functions: tuple[str, ...], problems: list[Problem], given: GivenInputs | None = None
) -> None:
    """Each reward function (``reward.functions``; ``given``: those passed in Python) requires only arguments the
    rows give it (``functions.check_arguments``)."""
    available = list(reward_columns(problems[:1]))
    for spec, fn in load_functions(functions, given):
        check_arguments(spec, fn, available)


class Rewarder:
    """Scores a batch: ``reward.functions`` (weights ``reward.weights``), the accuracy verifier when it is not among
    them (weight 0: for ``validation/accuracy``), the RM at ``reward.model.path`` and the PRM at
    ``reward.process_model.path``, which read each prompt with ``system_prompt`` (``data.system_prompt``) as the
    policy did. ``backend``: ``cluster.backend``, where the functions run (``RewardScorer``); ``device``: the RM's;
    ``given``: the functions passed in Python. Its ``budget`` counts the failed chunks of each step
    (``failures.FailureBudget``); ``gave_steps`` says whether the last batch it scored had a step."""

    def __init__(
        self,
        reward: RewardConfig,
        system_prompt: str | None,
        backend: str,
        device: torch.device | None,
        given: GivenInputs | None = None,
    ):
        self.system_prompt = system_prompt
        specs = list(reward.functions)
        self.weights = list(reward.weights)
        self.names = [parse_spec(s).name for s in specs]
        if reward.accuracy_from in BUILTINS and reward.accuracy_from not in self.names:
            specs.append(reward.accuracy_from)
            self.weights.append(0.0)
            self.names.append(reward.accuracy_from)
        self.accuracy_name = reward.accuracy_from
        self.scorer = RewardScorer(reward, backend, specs, given)
        self.budget = FailureBudget(reward.max_failed_fraction, reward.failure_window)
        self.model, self.model_weight = None, reward.model.weight
        if reward.model.path is not None:
            from dtppo.rewards.model import RewardModel

            self.model = RewardModel(reward.model, device)
        self.process_model, self.process_weight = None, reward.process_model.weight
        if reward.process_model.path is not None:
            from dtppo.rewards.process_model import ProcessRewardModel

            self.process_model = ProcessRewardModel(reward.process_model, system_prompt, device)
        self.gave_steps = False

    def score(
        self, problems: list[Problem], completions: list[str], while_scoring: Callable[[], None] | None = None
    ) -> RewardBreakdown:
        """The reward of each (problem, completion) pair: completions are the generated texts, given to the
        functions as text, or as ``[{"role": "assistant", "content": ...}]`` for conversational rows (TRL's form).
        ``while_scoring``: work of the caller's to run while the functions run elsewhere (``RewardScorer.score``)."""
        prompts = [p.question for p in problems]
        given = [
            [{"role": "assistant", "content": c}] if p.conversational else c for p, c in zip(problems, completions)
        ]
        scored = self.scorer.score(prompts, given, reward_columns(problems), while_scoring)
        self.budget.record(scored.chunks, scored.failures)
        scores = dict(zip(self.names, scored.scores))
        weighted = [(self.weights[i], scores[name]) for i, name in enumerate(self.names)]
        if self.model is not None:
            conversations = [
                conversation(p.question, self.system_prompt) + [{"role": "assistant", "content": c}]
                for p, c in zip(problems, completions)
            ]
            scores[MODEL_NAME] = self.model.score(conversations).tolist()
            weighted.append((self.model_weight, scores[MODEL_NAME]))
        if self.process_model is not None:
            scores[PROCESS_MODEL_NAME] = self.process_model.score(prompts, completions)
            weighted.append((self.process_weight, scores[PROCESS_MODEL_NAME]))
        outcome, steps = weighted_parts(weighted, scored.failed)
        self.gave_steps = any(steps)
        failed = torch.tensor(scored.failed, dtype=torch.bool)
        return RewardBreakdown(outcome, steps, scores, failed, failure_counts(scored.failures, int(failed.sum())))

    def close(self) -> None:
        self.scorer.close()
