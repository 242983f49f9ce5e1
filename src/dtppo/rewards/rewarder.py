"""The total reward of a batch: the weighted reward functions (run in the scoring pool) plus the learned reward
model (run in this rank's process, on its device), with each part's scores kept for the metrics."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dtppo.config import Config, RewardConfig
from dtppo.config.reward_spec import BUILTINS, LATE_CHUNKS_NAME, MODEL_NAME, parse_spec
from dtppo.data.loader import conversation
from dtppo.data.problem import Problem
from dtppo.rewards.functions import Scores, check_arguments, load_functions
from dtppo.rewards.scoring import RewardScorer


@dataclass(frozen=True)
class RewardBreakdown:
    """total: [B] float32, the weighted sum (a None score counts as 0). scores: each part's scores by metric name
    (the functions', the accuracy verifier's when it is not one of them, ``model`` for the RM), one per sample.
    late_chunks: how many chunks of this batch missed ``reward.timeout_s`` (every function scored them 0.0)."""

    total: torch.Tensor
    scores: dict[str, Scores]
    late_chunks: int

    def means(self) -> dict[str, float]:
        """Each part's mean over the samples it applies to (not None), a part that applied to none left out; and
        ``late_chunks`` under ``LATE_CHUNKS_NAME``, so that a step whose rewards were partly zeroed shows in its
        record."""
        means = {}
        for name, scores in self.scores.items():
            given = [s for s in scores if s is not None]
            if given:
                means[name] = sum(given) / len(given)
        return means | {LATE_CHUNKS_NAME: float(self.late_chunks)}

    def take(self, rows: list[int]) -> RewardBreakdown:
        """The samples ``rows`` (indices into this batch); the late chunks stay the whole batch's."""
        scores = {name: [values[i] for i in rows] for name, values in self.scores.items()}
        return RewardBreakdown(self.total[rows], scores, self.late_chunks)


def concat_breakdowns(parts: list[RewardBreakdown]) -> RewardBreakdown:
    """Batches scored one after the other (dynamic sampling's extra batches) as one: samples in order, late chunks
    added."""
    scores = {name: [s for part in parts for s in part.scores[name]] for name in parts[0].scores}
    return RewardBreakdown(torch.cat([part.total for part in parts]), scores, sum(part.late_chunks for part in parts))


def reward_columns(problems: list[Problem]) -> dict[str, list]:
    """Every column of the batch's rows as a keyword list (a row without a column gives None), and the reference as
    ``answer`` where the task has one."""
    names = list(dict.fromkeys(name for p in problems for name in p.columns))
    columns = {name: [p.columns.get(name) for p in problems] for name in names}
    if any(p.answer is not None for p in problems):
        columns["answer"] = [p.answer for p in problems]
    return columns


def check_reward_arguments(cfg: Config, problems: list[Problem]) -> None:
    """Each reward function requires only arguments the rows give it (``functions.check_arguments``)."""
    available = list(reward_columns(problems[:1]))
    for spec, fn in load_functions(cfg.reward.functions):
        check_arguments(spec, fn, available)


class Rewarder:
    """Scores a batch: ``reward.functions`` (weights ``reward.weights``), the accuracy verifier when it is not among
    them (weight 0: for ``validation/accuracy``), and the RM at ``reward.model.path``, which reads each prompt with
    ``system_prompt`` (``data.system_prompt``) as the policy did. ``backend``: ``cluster.backend``, where the
    functions run (``RewardScorer``); ``device``: the RM's."""

    def __init__(self, reward: RewardConfig, system_prompt: str | None, backend: str, device: torch.device | None):
        self.system_prompt = system_prompt
        specs = list(reward.functions)
        self.weights = list(reward.weights)
        self.names = [parse_spec(s).name for s in specs]
        if reward.accuracy_from in BUILTINS and reward.accuracy_from not in self.names:
            specs.append(reward.accuracy_from)
            self.weights.append(0.0)
            self.names.append(reward.accuracy_from)
        self.accuracy_name = reward.accuracy_from
        self.scorer = RewardScorer(reward, backend, specs)
        self.model, self.model_weight = None, reward.model.weight
        if reward.model.path is not None:
            from dtppo.rewards.model import RewardModel

            self.model = RewardModel(reward.model, device)

    def score(self, problems: list[Problem], completions: list[str]) -> RewardBreakdown:
        """The reward of each (problem, completion) pair: completions are the generated texts, given to the
        functions as text, or as ``[{"role": "assistant", "content": ...}]`` for conversational rows (TRL's form)."""
        prompts = [p.question for p in problems]
        given = [
            [{"role": "assistant", "content": c}] if p.conversational else c for p, c in zip(problems, completions)
        ]
        late = self.scorer.late_chunks
        scores = dict(zip(self.names, self.scorer.score(prompts, given, reward_columns(problems))))
        weighted = [(self.weights[i], scores[name]) for i, name in enumerate(self.names)]
        if self.model is not None:
            conversations = [
                conversation(p.question, self.system_prompt) + [{"role": "assistant", "content": c}]
                for p, c in zip(problems, completions)
            ]
            scores[MODEL_NAME] = self.model.score(conversations).tolist()
            weighted.append((self.model_weight, scores[MODEL_NAME]))
        total = [sum(w * part[i] for w, part in weighted if part[i] is not None) for i in range(len(completions))]
        return RewardBreakdown(torch.tensor(total, dtype=torch.float32), scores, self.scorer.late_chunks - late)

    def close(self) -> None:
        self.scorer.close()
