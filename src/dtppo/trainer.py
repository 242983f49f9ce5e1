"""PPOTrainer: the PPO algorithm for language models, one step top to bottom (docs/design.md, "Data flow")."""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from dtppo import checkpoint
from dtppo.algorithms.advantages import first_token_abs_mean, outcome_returns
from dtppo.algorithms.kl import kl_estimate
from dtppo.algorithms.losses import EV_MIN_RETURNS_VAR, explained_var
from dtppo.algorithms.mismatch import mismatch_sample_mask, rollout_is_stats, rollout_is_weights, seq_mult_prob_error
from dtppo.algorithms.shaping import overlong_penalty
from dtppo.config import Config, batch_clamp_notes
from dtppo.data.loader import PromptLoader, build_sources
from dtppo.distributed.comm import broadcast, broadcast_object, is_main_rank
from dtppo.dynamic_sampling import build_group_filter
from dtppo.estimators import build_estimator
from dtppo.evaluation import EvalResult, decode_responses, eval_result
from dtppo.faults import RunStopped
from dtppo.logging import MetricsLogger
from dtppo.metrics import episode_metrics, mean_over, to_floats
from dtppo.models.description import describe_models
from dtppo.models.tokenizer import load_tokenizer
from dtppo.ops import masked_max, masked_mean, masked_min, masked_var
from dtppo.rewards.failures import RewardFailureError
from dtppo.rewards.rewarder import RewardBreakdown, Rewarder, check_reward_arguments, concat_breakdowns
from dtppo.rollouts import Rollout, build_rollouts
from dtppo.trackers import open_trackers
from dtppo.types import Experience, concat_rows
from dtppo.warmup import CriticWarmup
from dtppo.workers.layout import RankLayout
from dtppo.workers.policy import PolicyWorker
from dtppo.workers.role import PolicyRole, ValueRole
from dtppo.workers.value import ValueWorker


class PhaseTimer:
    """Wall time per named phase, reported as ``timing/<phase>`` seconds."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        yield
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start


class PPOTrainer:
    """Owns the policy and value roles (their workers, on whichever ranks hold them), the prompt loader and the
    step counter.

    The advantage estimator is chosen once (``estimators.build_estimator``): GAE with a critic, or GRPO without,
    when there is no value role (``self.value`` is None) and no critic is built, trained, checkpointed or logged.
    """

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.tokenizer = load_tokenizer(cfg.policy_init_path)
        cluster = cfg.cluster
        # Every rank builds both layouts (mesh creation is collective), then only the workers it holds.
        policy_layout = RankLayout(cfg.policy.parallel, cluster.pool("policy"))
        value_layout = RankLayout(cfg.value.parallel, cluster.pool("value"))
        self.policy = PolicyRole(
            PolicyWorker(cfg, self.tokenizer, policy_layout) if policy_layout.member else None,
            policy_layout.ranks,
            cluster.colocated,
        )
        self.estimate = build_estimator(cfg)
        self.group_filter = build_group_filter(cfg)  # None: every prompt group trains
        self.warmup = CriticWarmup(cfg)
        self.value: ValueRole | None = None
        if cfg.has_critic:
            self.value = ValueRole(
                ValueWorker(cfg, self.tokenizer, value_layout) if value_layout.member else None,
                value_layout.ranks,
                cluster.colocated,
            )
        train_source, self.validation_problems = build_sources(cfg, tokenizer=self.tokenizer)
        check_reward_arguments(cfg, [train_source[0]])  # needs a row: not preflight's, which reads no data
        self.rollouts = build_rollouts(cfg, self.policy, self.tokenizer, PromptLoader(train_source, cfg.ppo.seed))
        # Rank 0 (always a policy rank) scores every batch: the functions fanned out to its scoring pool, the reward
        # model on its device. The other ranks receive the rewards.
        self.rewarder = (
            Rewarder(cfg.reward, cfg.data.system_prompt, cfg.cluster.backend, self.policy.worker.layout.device)
            if is_main_rank()
            else None
        )
        # What every checkpoint carries besides weights (configs, tokenizer): written by rank 0, a policy rank.
        self.model_files = (
            describe_models(cfg, self.policy.worker.model, self.tokenizer)
            if is_main_rank() and cfg.checkpointing.enabled
            else None
        )
        self.steps_done = 0
        if is_main_rank():
            for note in batch_clamp_notes(cfg):
                print(note, flush=True)
        self.tracker_runs: dict[str, str] = {}  # rank 0: W&B / MLflow run ids, continued on resume

    # ------------------------------------------------------------------------------------------ one step

    def step(self) -> dict[str, float]:
        """One PPO iteration: rollout, reward, values (with dynamic sampling, until enough prompt groups carry a
        signal), advantages, critic update (``value.updates_per_step`` passes), policy update (once the critic's
        warmup is over).

        Without a critic (GRPO) it is the same step without the critic's phases."""
        cfg, timer = self.cfg, PhaseTimer()
        step_start = time.perf_counter()

        with timer("prompts"):  # drawn (and, with generation ranks, requested) up to ppo.max_lag steps ahead
            self.rollouts.submit(self.steps_done)

        # generation, reward (and overlong shaping), the critic's values; with dynamic sampling, until the step
        # holds enough groups that carry a signal
        rollout, reward_means, selection = self._scored_rollout(timer)
        experience = rollout.experience
        scored = experience.sample_mask  # None unless a reward chunk failed: its samples leave training from here
        if scored is not None and not scored.any():
            return self._unscored_step(reward_means, timer, step_start)

        with timer("policy_logprobs"), self.policy.inference():
            experience = experience.replace(old_logprobs=self.policy.get_logprobs(experience))
            if cfg.loss.kl_coef > 0.0:
                experience = experience.replace(ref_logprobs=self.policy.get_reference_logprobs(experience))

        with timer("rollout_correction"):
            experience = self._with_rollout_correction(experience)

        with timer("advantages"):
            experience = self.estimate(experience)

        fit = self._critic_fit(experience)  # before any update: it judges the critic's warmup and is logged
        train_policy = self._policy_trains(fit)
        runs = self._update(experience, train_policy, timer)

        with timer("weight_refit"):  # policy version steps_done + 1 to whoever samples the next batches
            self.rollouts.publish(self.steps_done + 1, updated=train_policy)

        metrics = self._rollout_metrics(experience, scored) | self._staleness_metrics(rollout)
        metrics |= episode_metrics(experience)
        metrics |= {f"train/reward/{name}": torch.tensor(mean) for name, mean in reward_means.items()}
        metrics |= {name: torch.tensor(value) for name, value in selection.items()}
        if runs.get("policy_update"):
            metrics |= {f"train/{k}": v for k, v in mean_over(runs["policy_update"]).items()}
        metrics["train/skipped_steps"] = torch.tensor(float(self.policy.skipped_steps()))
        if self.value is not None:
            metrics |= self._critic_metrics(experience, runs["critic_update"], fit)
            metrics |= {name: torch.tensor(value) for name, value in self.warmup.metrics(self.steps_done).items()}
        step_seconds = time.perf_counter() - step_start
        metrics["perf/tokens_per_sec"] = experience.attention_mask.sum() / step_seconds
        if torch.cuda.is_available():  # the most this process has held on its GPU so far
            metrics["perf/max_memory_allocated_gib"] = torch.tensor(torch.cuda.max_memory_allocated() / 2**30)
        metrics |= {f"timing/{phase}": torch.tensor(s) for phase, s in timer.seconds.items()}
        metrics["timing/step"] = torch.tensor(step_seconds)
        self.steps_done += 1
        return to_floats(metrics)

    def _unscored_step(self, reward_means: dict[str, float], timer: PhaseTimer, step_start: float) -> dict[str, float]:
        """A step whose every reward chunk failed: nothing trains (no model, schedule or warmup moves); its record
        holds the reward's failure counts and the timings, and ``train/reward`` is NaN (no reward is known)."""
        self.rollouts.publish(self.steps_done + 1, updated=False)
        metrics = {f"train/reward/{name}": mean for name, mean in reward_means.items()}
        metrics |= {"train/reward": float("nan"), "timing/step": time.perf_counter() - step_start}
        self.steps_done += 1
        return metrics | {f"timing/{phase}": seconds for phase, seconds in timer.seconds.items()}

    def _scored_rollout(self, timer: PhaseTimer) -> tuple[Rollout, dict[str, float], dict[str, float]]:
        """This step's samples with their rewards (and the critic's values), the reward parts' means (rank 0) and
        dynamic sampling's counts. With ``ppo.dynamic_sampling``, the first ``ppo.num_prompts_per_step`` groups
        that pass its criterion, from as many batches as that takes."""
        rollout, scored = self._scored_batch(timer, extra=0)
        if self.group_filter is None:
            return rollout, scored.means() if scored is not None else {}, {}
        return self._fill_with_signal(rollout, scored, timer)

    def _scored_batch(self, timer: PhaseTimer, extra: int) -> tuple[Rollout, RewardBreakdown | None]:
        """One batch (the step's own, or dynamic sampling's ``extra``-th more) sampled, rewarded (overlong shaping
        included) and valued by the critic; the reward parts on rank 0, None elsewhere."""
        with timer("generation"):
            step = self.steps_done
            rollout = self.rollouts.take(step) if extra == 0 else self.rollouts.take_extra(step, extra)
            experience = rollout.experience
        with timer("reward"):
            rewards, failed, scored = torch.zeros(experience.batch_size), torch.zeros(experience.batch_size), None
            if self.rewarder is not None:
                scored = self.rewarder.score(rollout.problems, decode_responses(self.tokenizer, experience))
                rewards, failed = scored.total, scored.failed.float()
            rewards, failed = broadcast(torch.stack([rewards, failed]))
            experience = experience.replace(rewards=rewards + self._overlong_penalty(experience))
            if failed.any():  # no reward is known for them: not trained as if it were 0
                experience = experience.replace(sample_mask=1.0 - failed)
        if self.value is not None:
            with timer("value_inference"), self.value.inference():
                experience = experience.replace(old_values=self.value.get_values(experience))
        return dataclasses.replace(rollout, experience=experience), scored

    def _overlong_penalty(self, experience: Experience) -> torch.Tensor:
        """[B] DAPO's soft overlong penalty of each sample (``ppo.overlong_shaping``; 0 when off)."""
        shaping = self.cfg.ppo.overlong_shaping
        if not shaping.enabled:
            return torch.zeros(experience.batch_size)
        lengths = experience.response_mask.sum(-1)
        return overlong_penalty(lengths, self.cfg.policy.generation.max_new_tokens, shaping.buffer, shaping.factor)

    def _fill_with_signal(
        self, rollout: Rollout, scored: RewardBreakdown | None, timer: PhaseTimer
    ) -> tuple[Rollout, dict[str, float], dict[str, float]]:
        """Dynamic sampling: keep the groups that pass the criterion, batch after batch, until there are
        ``ppo.num_prompts_per_step`` (the last batch's surplus is dropped); stop the run past
        ``ppo.dynamic_sampling.max_gen_batches``."""
        sampling, needed = self.cfg.ppo.dynamic_sampling, self.cfg.ppo.num_prompts_per_step
        parts, problems, scores, have, passed, failed = [], [], [], 0, 0, 0
        for extra in range(sampling.max_gen_batches):
            if extra > 0:
                rollout, scored = self._scored_batch(timer, extra)
            groups = self.group_filter.keep(rollout.experience)
            passing = groups.nonzero().flatten()
            passed, failed = passed + len(passing), failed + len(groups) - len(passing)
            used = torch.zeros_like(groups)
            used[passing[: needed - have]] = True
            rows = self.group_filter.rows(used)
            if rows:
                # the filter keeps no group with a failed sample: every kept row trains
                parts.append(rollout.experience.take(torch.tensor(rows)).replace(sample_mask=None))
                problems += [rollout.problems[i] for i in rows]
                scores.append(scored.take(rows) if scored is not None else None)
            have += len(rows) // self.group_filter.group_size
            if have == needed:
                break
        else:
            raise RunStopped(
                f"ppo.dynamic_sampling: only {have} of the {needed} prompt groups a step trains on passed the "
                f"{sampling.criterion} criterion in {sampling.max_gen_batches} generated batches "
                f"(ppo.dynamic_sampling.max_gen_batches); the others carry no learning signal (reward_std: every "
                f"sample of the group got the same reward) or hold a sample whose reward chunk failed. Raise "
                f"max_gen_batches or num_generations_per_prompt, or train on problems nearer the policy's level"
            )
        experience = concat_rows(parts, self.tokenizer.pad_token_id)
        kept = Rollout(problems, experience, rollout.staleness, rollout.metrics)
        means = concat_breakdowns(scores).means() if scores[0] is not None else {}
        counts = {"gen_batches": extra + 1, "kept_groups": passed, "filtered_groups": failed}
        return kept, means, {f"train/dynamic_sampling/{name}": float(n) for name, n in counts.items()}

    def _critic_fit(self, experience: Experience) -> dict[str, torch.Tensor]:
        """The critic's fit to this batch's returns before its update, over the samples that train: ``returns_var``
        (0 when every sample got the same reward: the step's EV is then undefined, logging.explained_var_mean) and
        ``explained_var``; empty without a critic."""
        if self.value is None:
            return {}
        mask = experience.train_mask
        return {
            "returns_var": masked_var(experience.returns, mask, unbiased=False),
            "explained_var": explained_var(experience.returns, experience.old_values, mask),
        }

    def _policy_trains(self, fit: dict[str, torch.Tensor]) -> bool:
        """Whether the policy trains this step: after the critic's warmup (``warmup.CriticWarmup``), judged on the
        critic's explained variance on this batch before its update (``fit``, :meth:`_critic_fit`'s)."""
        defined = bool(fit) and float(fit["returns_var"]) > EV_MIN_RETURNS_VAR
        return self.warmup.policy_trains(self.steps_done, float(fit["explained_var"]) if defined else None)

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

    def _with_rollout_correction(self, experience: Experience) -> Experience:
        """The samples that leave training (``sample_mask``, besides those whose reward failed): truncated ones with
        ``ppo.overlong_filtering``, those whose probability error exceeds ``ppo.seq_logprob_error_threshold``; then
        the trained tokens get ``loss.rollout_is`` weights."""
        cfg, threshold = self.cfg, self.cfg.ppo.seq_logprob_error_threshold
        if cfg.ppo.overlong_filtering:
            complete = (~experience.truncated).float()
            scored = experience.sample_mask
            experience = experience.replace(sample_mask=complete if scored is None else complete * scored)
            if not experience.sample_mask.any():
                raise RunStopped(
                    "every scored sample of the step was truncated and ppo.overlong_filtering leaves them all out: "
                    "nothing is left to train on (raise policy.generation.max_new_tokens)"
                )
        if threshold is not None:
            error = seq_mult_prob_error(experience.gen_logprobs, experience.old_logprobs, experience.response_mask)
            mismatch = mismatch_sample_mask(error, threshold)
            kept = mismatch if experience.sample_mask is None else mismatch * experience.sample_mask
            experience = experience.replace(sample_mask=kept)
            if not experience.sample_mask.any():
                raise RunStopped(
                    f"every sample's probability error exceeds ppo.seq_logprob_error_threshold = {threshold} "
                    f"(smallest {float(error.min()):.4g}): the generator's log-probs do not match the policy's "
                    f"(stale or wrong weights in the generator?); nothing is left to train on"
                )
        if cfg.loss.rollout_is is not None:
            weights = rollout_is_weights(
                experience.old_logprobs,
                experience.gen_logprobs,
                experience.train_mask,
                cfg.loss.rollout_is,
                cfg.loss.rollout_is_cap,
            )
            experience = experience.replace(is_weights=weights)
        return experience

    def _rollout_metrics(self, experience: Experience, scored: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """Metrics of the samples themselves (all of them; the reward over those ``scored``, [B] 0 / 1, None = all),
        of the mismatch, and of the advantages (those that train)."""
        mask, trained = experience.response_mask, experience.train_mask
        seq_error = seq_mult_prob_error(experience.gen_logprobs, experience.old_logprobs, mask)
        behaviour_ratio = torch.exp(experience.old_logprobs - experience.gen_logprobs)
        returns = experience.episode_returns
        metrics = {
            "train/reward": returns.mean() if scored is None else masked_mean(returns, scored),
            "train/advantages/mean": masked_mean(experience.advantages, trained),
            "train/advantages/min": masked_min(experience.advantages, trained),
            "train/advantages/max": masked_max(experience.advantages, trained),
            "train/advantages/first_token_abs_mean": first_token_abs_mean(experience.advantages, trained),
            "train/token_mult_prob_error": masked_mean(
                torch.exp((experience.gen_logprobs - experience.old_logprobs).abs()), mask
            ),
            # π_old/π_gen: the behaviour policy against the one trained (max_lag steps newer, or the same weights)
            "train/behaviour_ratio/mean": masked_mean(behaviour_ratio, trained),
            "train/behaviour_ratio/min": masked_min(behaviour_ratio, trained),
            "train/behaviour_ratio/max": masked_max(behaviour_ratio, trained),
            "train/seq_mult_prob_error/mean": seq_error.mean(),
            "train/seq_mult_prob_error/max": seq_error.max(),
            "train/mean_gen_tokens_per_sample": mask.sum(-1).mean(),
            "train/truncation_rate": experience.truncated.float().mean(),
        }
        threshold = self.cfg.ppo.seq_logprob_error_threshold
        if threshold is not None:
            metrics["train/num_masked_seqs_by_logprob_error"] = (mismatch_sample_mask(seq_error, threshold) == 0).sum()
        if self.cfg.ppo.overlong_filtering:
            metrics["train/overlong/filtered_samples"] = experience.truncated.sum()
        if self.cfg.ppo.overlong_shaping.enabled:
            penalty = self._overlong_penalty(experience)
            metrics["train/overlong/shaped_samples"] = (penalty < 0).sum()
            metrics["train/overlong/penalty_mean"] = penalty.mean()
        if experience.is_weights is not None:
            stats = rollout_is_stats(experience.is_weights, trained, self.cfg.loss.rollout_is_cap)
            metrics |= {f"train/rollout_is/{name}": value for name, value in stats.items()}
        if experience.ref_logprobs is not None:
            kl = kl_estimate(self.cfg.loss.kl_estimator, experience.old_logprobs, experience.ref_logprobs)
            metrics["train/kl_penalty"] = masked_mean(kl, mask)
        return metrics

    def _staleness_metrics(self, rollout: Rollout) -> dict[str, torch.Tensor]:
        """Steps between the policy that sampled the batch and the one it trains (the same for every sample: a
        batch is never sampled across a weight change), and the generation ranks' timings when they sampled it."""
        staleness = torch.tensor(float(rollout.staleness))
        metrics = {"train/staleness/mean": staleness, "train/staleness/max": staleness}
        return metrics | {name: torch.tensor(value) for name, value in rollout.metrics.items()}

    def _critic_metrics(
        self, experience: Experience, critic_runs: list[dict], fit: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The critic's predictions before its update (``fit``: :meth:`_critic_fit`'s), and its update statistics
        (``train/critic/*``), over the samples that train."""
        mask = experience.train_mask
        metrics = {
            "values_mean": masked_mean(experience.old_values, mask),
            "values_min": masked_min(experience.old_values, mask),
            "values_max": masked_max(experience.old_values, mask),
            "returns_mean": masked_mean(experience.returns, mask),
            **fit,
            # against what the responses actually got, whatever the targets (V-trace's bootstrap toward V)
            "explained_var_outcome": explained_var(
                outcome_returns(experience.rewards, mask, self.cfg.ppo.gamma), experience.old_values, mask
            ),
            **mean_over(critic_runs),
            "skipped_steps": torch.tensor(float(self.value.skipped_steps())),
        }
        return {f"train/critic/{k}": v for k, v in metrics.items()}

    # ------------------------------------------------------------------------------------------ the run

    def evaluate(self) -> EvalResult | None:
        """The policy's answers to the validation problems, scored like training samples; None off rank 0."""
        responses = self.rollouts.validation(self.validation_problems, self.steps_done)
        if self.rewarder is None:
            return None
        scored = self.rewarder.score(self.validation_problems, responses.texts)
        problems, accuracy_from = self.validation_problems, self.rewarder.accuracy_name
        return eval_result(problems, responses, scored.total, scored.means(), accuracy_from, scored.failed)

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

    def fit(self) -> list[dict[str, float]]:
        """Run until ``ppo.max_num_steps``, resuming from the latest complete checkpoint if there is one."""
        cfg = self.cfg
        self.maybe_resume()
        # Every rank runs the same loop; rank 0 alone writes logs (all metrics are already reduced).
        trackers = open_trackers(cfg.logger, cfg.to_dict(), self.tracker_runs) if is_main_rank() else []
        self.tracker_runs = {t.name: t.run_id for t in trackers}
        logger = MetricsLogger(
            cfg.logger.log_dir,
            cfg.ppo.max_num_steps,
            cfg.logger.tensorboard,
            cfg.logger.progress,
            resume_step=self.steps_done,
            enabled=is_main_rank(),
            trackers=trackers,
        )
        history, finished = [], False
        try:
            if self.steps_done == 0 and cfg.ppo.val_at_start:
                logger.log(0, self.validate())
            while self.steps_done < cfg.ppo.max_num_steps:
                metrics = self.step()
                last = self.steps_done == cfg.ppo.max_num_steps
                if self.steps_done % cfg.ppo.val_period == 0 or last:
                    metrics |= self.validate()
                logger.log(self.steps_done, metrics)
                history.append(metrics)
                stop, saved = self._reward_failures(last), None
                if cfg.checkpointing.enabled and (self.steps_done % cfg.checkpointing.save_period == 0 or last or stop):
                    saved = self.save()
                if stop:
                    kept = f"checkpoint {saved}" if saved is not None else "not checkpointed: checkpointing is off"
                    raise RewardFailureError(f"{stop}; stopped after step {self.steps_done} ({kept})")
            finished = True
        finally:
            self.rollouts.close()
            logger.close(finished)
            if self.rewarder is not None:
                self.rewarder.close()
        return history

    def _reward_failures(self, last: bool) -> str | None:
        """Rank 0's verdict on the step's failed reward chunks (``FailureBudget.end_step``), on every rank."""
        return broadcast_object(self.rewarder.budget.end_step(last) if self.rewarder is not None else None, src=0)

    def save(self) -> Path:
        """Collective over all ranks: each pool writes its shards, rank 0 the replicated state."""
        sharded = self._sharded_state()
        replicated = {
            "policy": self.policy.replicated_state(),
            "loader": self.rollouts.prompts.position(self.steps_done),
            "rollouts": self.rollouts.state_dict(),  # the batches in flight (rank 0; empty when synchronous)
            "rng": checkpoint.rng_state(),
            "steps_done": self.steps_done,
            "warmup": self.warmup.state_dict(),
            "trackers": self.tracker_runs,
            "reward_failures": self.rewarder.budget.state_dict() if self.rewarder is not None else {},
        }
        if self.value is not None:
            replicated["value"] = self.value.replicated_state()
        ckpt = self.cfg.checkpointing
        return checkpoint.save(
            ckpt.checkpoint_dir,
            self.steps_done,
            sharded,
            replicated,
            self.cfg.to_dict(),
            ckpt.keep_last,
            self.model_files,
        )

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
        step = checkpoint.latest_step(ckpt.checkpoint_dir) if ckpt.enabled else None
        if step is not None:
            self._resume(Path(ckpt.checkpoint_dir) / f"step_{step}")
        self.rollouts.start(self.steps_done)

    def _resume(self, path: Path) -> None:
        sharded = self._sharded_state()
        replicated, _ = checkpoint.load(path, sharded)
        self.policy.load_checkpoint(sharded.get("policy"), replicated["policy"])
        if self.value is not None:
            self.value.load_checkpoint(sharded.get("value"), replicated["value"])
        self.steps_done = int(replicated["steps_done"])
        if "warmup" in replicated:  # absent in checkpoints written before value.warmup_until_ev (a fixed warmup)
            self.warmup.load_state_dict(replicated["warmup"])
        # Written before asynchronous PPO: no "rollouts" (nothing was in flight).
        self.rollouts.restore(replicated["loader"], replicated.get("rollouts", {}), self.steps_done)
        checkpoint.set_rng_state(replicated["rng"])
        self.tracker_runs = replicated.get("trackers", {})  # absent in checkpoints written before trackers
        if self.rewarder is not None and replicated.get("reward_failures"):  # absent before the failure budget
            self.rewarder.budget.load_state_dict(replicated["reward_failures"])
        if is_main_rank():
            print(f"resumed from {path}", flush=True)
