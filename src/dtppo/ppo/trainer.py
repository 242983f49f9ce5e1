"""PPOLoop: the PPO algorithm for language models, one step top to bottom (docs/design/architecture.md)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from dtppo.checkpoint import store
from dtppo.config import Config, batch_clamp_notes
from dtppo.data.loader import PromptLoader, build_sources
from dtppo.distributed.comm import broadcast_object, is_main_rank
from dtppo.models.description import describe_models
from dtppo.models.tokenizer import load_tokenizer
from dtppo.observability.logger import MetricsLogger
from dtppo.observability.metrics import to_floats
from dtppo.observability.timing import PhaseTimer
from dtppo.observability.trackers import TrackerRuns
from dtppo.ppo.advantage_estimator import build_estimator
from dtppo.ppo.critic_warmup import CriticWarmup, critic_fit, defined_ev
from dtppo.ppo.dynamic_sampling import build_group_filter
from dtppo.ppo.reward_phase import rewarded
from dtppo.ppo.rollouts import Rollout, ScoredBatch, build_rollouts
from dtppo.ppo.sample_filters import filter_samples, overlong_penalties
from dtppo.ppo.step_metrics import timing_metrics, train_metrics
from dtppo.rewards.failures import RewardFailureError
from dtppo.rewards.rewarder import RewardBreakdown, Rewarder, check_reward_arguments
from dtppo.rewards.validation import EvalResult, eval_result
from dtppo.types import Experience
from dtppo.usercode.given import NOTHING_GIVEN, GivenInputs
from dtppo.workers.layout import RankLayout
from dtppo.workers.policy import PolicyWorker
from dtppo.workers.role import PolicyRole, ValueRole
from dtppo.workers.value import ValueWorker


class Stateful(Protocol):
    """A part of the trainer that a checkpoint saves and restores by itself."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any] | None) -> None: ...


class RunEvents(Protocol):
    """What a run tells whoever drives it, on rank 0 (``dtppo.PPOTrainer``'s callbacks): a step's metrics (its
    ``validation/*`` included when it validated), a validation's, a checkpoint written."""

    def step_end(self, step: int, metrics: dict[str, float]) -> None: ...

    def validation_end(self, step: int, metrics: dict[str, float]) -> None: ...

    def saved(self, step: int, path: Path) -> None: ...


@dataclass
class RunLog:
    """An open run's record keeping on rank 0 (``PPOLoop.open_run``): the metrics file and trackers, what it tells
    ``events``, and the metrics of each step run since it opened."""

    logger: MetricsLogger
    events: RunEvents | None
    history: list[dict[str, float]] = field(default_factory=list)


class PPOLoop:
    """Owns the policy and value roles (their workers, on whichever ranks hold them), the prompt loader and the
    step counter.

    The advantage estimator is chosen once (``advantage_estimator.build_estimator``): GAE with a critic, or GRPO
    without, when there is no value role (``self.value`` is None) and no critic is built, trained, checkpointed or
    logged.
    """

    def __init__(self, cfg: Config, given: GivenInputs = NOTHING_GIVEN):
        self.cfg = cfg
        self.tokenizer = load_tokenizer(cfg.policy_init_path)
        cluster = cfg.cluster
        # Every rank builds both layouts (mesh creation is collective), then only the workers it holds.
        policy_layout = RankLayout(cfg.policy.parallel, cluster.pool("policy"))
        value_layout = RankLayout(cfg.value.parallel, cluster.pool("value"))
        self.device = policy_layout.device  # this rank's, whichever pool it is in
        self.policy = PolicyRole(
            PolicyWorker(cfg, self.tokenizer, policy_layout) if policy_layout.member else None,
            policy_layout.ranks,
            cluster.colocated,
        )
        self.estimate = build_estimator(cfg)
        self.group_filter = build_group_filter(cfg)  # None: every prompt group trains
        self.warmup = CriticWarmup(cfg.value.warmup)
        self.value: ValueRole | None = None
        if cfg.has_critic:
            self.value = ValueRole(
                ValueWorker(cfg, self.tokenizer, value_layout) if value_layout.member else None,
                value_layout.ranks,
                cluster.colocated,
            )
        train_source, self.validation_problems = build_sources(
            cfg.data, cfg.ppo.seed, cfg.ppo.validation.max_samples, tokenizer=self.tokenizer, rows=given.rows
        )
        # needs a row: not preflight's, which reads no data
        check_reward_arguments(cfg.reward.functions, [train_source[0]], given)
        self.rollouts = build_rollouts(cfg, self.policy, self.tokenizer, PromptLoader(train_source, cfg.ppo.seed))
        # Rank 0 (always a policy rank) scores every batch: the functions fanned out to its scoring pool, the reward
        # model on its device. The other ranks receive the rewards.
        self.rewarder = (
            Rewarder(cfg.reward, cfg.data.system_prompt, cfg.cluster.backend, self.policy.worker.layout.device, given)
            if is_main_rank()
            else None
        )
        # What every checkpoint carries besides weights (configs, tokenizer): written by rank 0, a policy rank.
        self.model_files = (
            describe_models(self.policy.worker.model, self.tokenizer, cfg.policy_init_path, cfg.critic_model)
            if is_main_rank() and cfg.checkpointing.enabled
            else None
        )
        self.steps_done = 0
        if is_main_rank():
            for note in batch_clamp_notes(cfg):
                print(note, flush=True)
        self.trackers = TrackerRuns()  # rank 0: the W&B / MLflow runs, continued on resume

    # ------------------------------------------------------------------------------------------ one step

    def step(self) -> dict[str, float]:
        """One PPO iteration: rollout, reward, values (with dynamic sampling, until enough prompt groups carry a
        signal), advantages, critic update (``value.updates_per_step`` passes), policy update (once the critic's
        warmup is over).

        Without a critic (GRPO) it is the same step without the critic's phases."""
        cfg, timer = self.cfg, PhaseTimer(self.device)
        step_start = time.perf_counter()

        with timer("prompts"):  # drawn (and, with generation ranks, requested) up to ppo.max_lag steps ahead
            self.rollouts.submit(self.steps_done)
        with timer("generation"):
            rollout = self.rollouts.take(self.steps_done)
        with timer("reward"):  # overlong shaping included
            rollout, scored = self._rewarded(rollout)
        if self.value is not None:
            with timer("value_inference"), self.value.inference():
                rollout = self._valued(rollout)
        # dynamic sampling: more batches (the three phases above again) until enough prompt groups carry a signal
        batch = self._kept_groups(rollout, scored, timer)
        experience = batch.rollout.experience
        known = experience.sample_mask  # None unless a reward chunk failed: its samples leave training from here
        if known is not None and not known.any():
            return self._unscored_step(batch, timer, step_start)

        with timer("policy_logprobs"), self.policy.inference():
            experience = experience.replace(old_logprobs=self.policy.get_logprobs(experience))
            if cfg.loss.kl.coef > 0.0:
                experience = experience.replace(ref_logprobs=self.policy.get_reference_logprobs(experience))

        with timer("rollout_correction"):  # overlong filtering, the mismatch mask, rollout-IS weights
            experience = filter_samples(experience, cfg)

        with timer("advantages"):
            experience = self.estimate(experience)

        with timer("step_metrics"):  # before any update: the critic's fit is logged, and it judges the warmup
            fit = critic_fit(experience) if self.value is not None else {}
        train_policy = self.warmup.policy_trains(self.steps_done, defined_ev(fit))  # the critic's warmup
        runs = self._update(experience, train_policy, timer)

        with timer("weight_refit"):  # policy version steps_done + 1 to whoever samples the next batches
            self.rollouts.publish(self.steps_done + 1, updated=train_policy)

        with timer("step_metrics"):
            metrics = train_metrics(cfg, batch, experience, runs, fit) | self._counters()
        metrics |= timing_metrics(timer, experience, time.perf_counter() - step_start)
        self.steps_done += 1
        return to_floats(metrics)

    def _counters(self) -> dict[str, torch.Tensor]:
        """The run's counts so far: optimizer steps each model skipped (non-finite), the critic's warmup."""
        metrics = {"train/skipped_steps": torch.tensor(float(self.policy.skipped_steps()))}
        if self.value is not None:
            metrics["train/critic/skipped_steps"] = torch.tensor(float(self.value.skipped_steps()))
            metrics |= {name: torch.tensor(value) for name, value in self.warmup.metrics(self.steps_done).items()}
        return metrics

    def _unscored_step(self, batch: ScoredBatch, timer: PhaseTimer, step_start: float) -> dict[str, float]:
        """A step whose every reward chunk failed: nothing trains (no model, schedule or warmup moves); its record
        holds the reward's failure counts and the timings, and ``train/reward`` is NaN (no reward is known)."""
        self.rollouts.publish(self.steps_done + 1, updated=False)
        metrics = {f"train/reward/{name}": mean for name, mean in batch.reward_means.items()}
        metrics["train/reward"] = float("nan")
        self.steps_done += 1
        return metrics | to_floats(timing_metrics(timer, None, time.perf_counter() - step_start))

    def _rewarded(self, rollout: Rollout) -> tuple[Rollout, RewardBreakdown | None]:
        """``rollout`` with its rewards (overlong shaping included) on every rank; the reward parts on rank 0, None
        elsewhere (``reward_phase``)."""
        penalties = overlong_penalties(rollout.experience, self.cfg)
        experience, scored = rewarded(self.rewarder, self.tokenizer, rollout.experience, rollout.problems, penalties)
        return dataclasses.replace(rollout, experience=experience), scored

    def _valued(self, rollout: Rollout) -> Rollout:
        """``rollout`` with the critic's values of its tokens (``old_values``)."""
        experience = rollout.experience.replace(old_values=self.value.get_values(rollout.experience))
        return dataclasses.replace(rollout, experience=experience)

    def _kept_groups(self, rollout: Rollout, scored: RewardBreakdown | None, timer: PhaseTimer) -> ScoredBatch:
        """The batch the step trains on: ``rollout`` whole, or with ``ppo.dynamic_sampling`` the first
        ``ppo.num_prompts_per_step`` groups that pass its criterion, from as many more batches as that takes."""
        if self.group_filter is None:
            return ScoredBatch(rollout, scored.means() if scored is not None else {}, {})

        def more(extra: int) -> tuple[Rollout, RewardBreakdown | None]:
            with timer("generation"):
                rollout = self.rollouts.take_extra(self.steps_done, extra)
            with timer("reward"):
                rollout, scored = self._rewarded(rollout)
            if self.value is not None:
                with timer("value_inference"), self.value.inference():
                    rollout = self._valued(rollout)
            return rollout, scored

        return self.group_filter.fill(rollout, scored, more, self.tokenizer.pad_token_id)

    def _update(self, experience: Experience, train_policy: bool, timer: PhaseTimer) -> dict[str, list[dict]]:
        """``ppo.ppo_epochs`` epochs of the critic's update (``value.updates_per_step`` passes each) and (when
        ``train_policy``) the policy's (one pass each); each phase's statistics per pass, by phase name.

        Every update of an epoch starts before any result is shared: a role's ``train`` runs on its own ranks
        only and ``share`` is the collective, so in separate pools (``cluster.policy_ranks``) the critic and the
        policy update at the same time, and colocated they run one after the other as before."""
        updates: list[tuple[PolicyRole | ValueRole, str]] = []
        if self.value is not None:
            updates.append((self.value, "critic_update"))
        if train_policy:
            updates.append((self.policy, "policy_update"))
        runs: dict[str, list[dict]] = {phase: [] for _, phase in updates}
        passes = {"critic_update": self.cfg.value.updates_per_step, "policy_update": 1}
        for _ in range(self.cfg.ppo.ppo_epochs):
            started = []
            for role, phase in updates:
                for _ in range(passes[phase]):
                    with timer(phase), role.training():
                        started.append((role, phase, role.train(experience)))
            with timer("share_metrics"):
                for role, phase, stats in started:
                    runs[phase].append(role.share(stats))
        return runs

    # ------------------------------------------------------------------------------------------ the run

    def evaluate(self) -> EvalResult | None:
        """The policy's answers to the validation problems, scored like training samples; None off rank 0."""
        responses = self.rollouts.validation(self.validation_problems, self.steps_done)
        if self.rewarder is None:
            return None
        scored = self.rewarder.score(self.validation_problems, responses.texts)
        problems, accuracy_from = self.validation_problems, self.rewarder.accuracy_name
        return eval_result(
            problems, responses.texts, responses.lengths, scored.total, scored.means(), accuracy_from, scored.failed
        )

    def validate(self) -> dict[str, float]:
        """``validation/*`` metrics (rank 0; the other ranks only take part in sampling)."""
        start = time.perf_counter()
        result = self.evaluate()
        if result is None:
            return {}
        metrics = {"validation/reward": result.reward, "validation/avg_length": result.avg_length}
        if result.accuracy is not None:
            metrics["validation/accuracy"] = result.accuracy
        metrics |= {f"validation/reward/{name}": mean for name, mean in result.rewards.items()}
        return metrics | {"timing/validation": time.perf_counter() - start}

    def fit(self, events: RunEvents | None = None) -> list[dict[str, float]]:
        """Run until ``ppo.max_num_steps``, resuming from the latest complete checkpoint if there is one; the metrics
        of each step run."""
        run, finished = self.open_run(events), False
        try:
            while self.steps_done < self.cfg.ppo.max_num_steps:
                self.run_step(run)
            finished = True
        finally:
            self.close_run(run, finished)
        return run.history

    def open_run(self, events: RunEvents | None = None) -> RunLog:
        """Resume (``maybe_resume``), open the metrics log and trackers (rank 0 alone writes: all metrics are already
        reduced), and validate the starting policy when the run starts at step 0 and ``ppo.validation.at_start``."""
        cfg = self.cfg
        self.maybe_resume()
        trackers = self.trackers.open(cfg.logger, cfg.to_dict()) if is_main_rank() else []
        logger = MetricsLogger(
            cfg.logger.log_dir,
            cfg.ppo.max_num_steps,
            cfg.logger.tensorboard,
            cfg.logger.progress,
            resume_step=self.steps_done,
            enabled=is_main_rank(),
            trackers=trackers,
        )
        run = RunLog(logger, events if is_main_rank() else None)
        if self.steps_done == 0 and cfg.ppo.validation.at_start:
            self._validated(run, {})
        return run

    def run_step(self, run: RunLog) -> dict[str, float]:
        """One step of the run with what surrounds it: validation every ``ppo.validation.period`` steps and at the
        last, the metrics logged, a checkpoint every ``checkpointing.save_period`` steps and at the last, the stop when
        reward chunks failed past their budget. Returns the step's metrics."""
        cfg = self.cfg
        metrics = self.step()
        last = self.steps_done == cfg.ppo.max_num_steps
        if self.steps_done % cfg.ppo.validation.period == 0 or last:
            metrics = self._validated(run, metrics)
        else:
            run.logger.log(self.steps_done, metrics)
        run.history.append(metrics)
        if run.events is not None:
            run.events.step_end(self.steps_done, metrics)
        stop, saved = self._reward_failures(last), None
        if cfg.checkpointing.enabled and (self.steps_done % cfg.checkpointing.save_period == 0 or last or stop):
            saved = self.save()
            if run.events is not None:
                run.events.saved(self.steps_done, saved)
        if stop:
            kept = f"checkpoint {saved}" if saved is not None else "not checkpointed: checkpointing is off"
            raise RewardFailureError(f"{stop}; stopped after step {self.steps_done} ({kept})")
        return metrics

    def _validated(self, run: RunLog, metrics: dict[str, float]) -> dict[str, float]:
        """``metrics`` (the step's, or none at the start) with the validation's, logged as the step's record."""
        validation = self.validate()
        run.logger.log(self.steps_done, metrics | validation)
        if run.events is not None:
            run.events.validation_end(self.steps_done, validation)
        return metrics | validation

    def close_run(self, run: RunLog, finished: bool) -> None:
        """``close``, and the log closed (``finished``: the run reached its end, which the trackers are told)."""
        self.close()
        run.logger.close(finished)

    def close(self) -> None:
        """Stop the rollouts' generation and the scoring processes."""
        self.rollouts.close()
        if self.rewarder is not None:
            self.rewarder.close()

    def _reward_failures(self, last: bool) -> str | None:
        """Rank 0's verdict on the step's failed reward chunks (``FailureBudget.end_step``), on every rank."""
        return broadcast_object(self.rewarder.budget.end_step(last) if self.rewarder is not None else None, src=0)

    def save(self) -> Path:
        """Collective over all ranks: each pool writes its shards, rank 0 the replicated state."""
        sharded = self._sharded_state()
        replicated = {name: part.state_dict() for name, part in self._stateful().items()}
        replicated |= {
            "policy": self.policy.replicated_state(),
            "rng": store.rng_state(),
            "steps_done": self.steps_done,
        }
        if self.value is not None:
            replicated["value"] = self.value.replicated_state()
        ckpt = self.cfg.checkpointing
        return store.save(
            ckpt.checkpoint_dir,
            self.steps_done,
            sharded,
            replicated,
            self.cfg.to_dict(),
            ckpt.keep_last,
            self.model_files,
        )

    def _stateful(self) -> dict[str, Stateful]:
        """What a checkpoint holds besides the models, the RNG and the step count, by key: the rollouts (the loader's
        position, the batches in flight), the critic's warmup, the trackers' runs and (rank 0) the reward failures."""
        parts: dict[str, Stateful] = {"rollouts": self.rollouts, "warmup": self.warmup, "trackers": self.trackers}
        if self.rewarder is not None:
            parts["reward_failures"] = self.rewarder.budget
        return parts

    def _sharded_state(self) -> dict[str, dict]:
        """The model and optimizer state this rank holds, keyed by role (a rank in one pool has one role)."""
        states = {
            "policy": self.policy.checkpoint_state(),
            "value": self.value.checkpoint_state() if self.value is not None else None,
        }
        return {role: state for role, state in states.items() if state is not None}

    def maybe_resume(self) -> None:
        """Load the latest complete checkpoint, whatever data-parallel size or pool layout wrote it; then whoever
        samples the batches gets the policy's current weights."""
        ckpt = self.cfg.checkpointing
        step = store.latest_step(ckpt.checkpoint_dir) if ckpt.enabled else None
        if step is not None:
            self._resume(Path(ckpt.checkpoint_dir) / f"step_{step}")
        self.rollouts.start(self.steps_done)

    def _resume(self, path: Path) -> None:
        sharded = self._sharded_state()
        replicated, _ = store.load(path, sharded)
        self.policy.load_checkpoint(sharded.get("policy"), replicated["policy"])
        if self.value is not None:
            self.value.load_checkpoint(sharded.get("value"), replicated["value"])
        self.steps_done = int(replicated["steps_done"])
        for name, part in self._stateful().items():
            part.load_state_dict(replicated.get(name))  # None: a checkpoint written before the part existed
        store.set_rng_state(replicated["rng"])
        if is_main_rank():
            print(f"resumed from {path}", flush=True)
