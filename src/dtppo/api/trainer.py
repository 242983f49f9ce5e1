"""dtppo as a library: ``load_config`` and ``PPOTrainer``, which ``dtppo sft|ppo|eval`` are thin layers over.

A run's ranks are this process (one local rank, or each torchrun rank) or processes the launcher starts (local ranks,
Ray actors). ``train`` works either way; ``step`` drives the loop in this process, so it needs a run of one rank.
Errors are raised, never turned into an exit: ``dtppo.errors``' classes, which the command line maps to its exit
codes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from dtppo import config as config_lib
from dtppo.api.events import Callbacks, EventListener
from dtppo.api.inputs import RewardFuncs, given_inputs
from dtppo.checkpoint import store
from dtppo.checkpoint.export import export_checkpoint
from dtppo.config import ClusterConfig, Config, ConfigError
from dtppo.distributed.ranks import this_process_as_rank, under_torchrun
from dtppo.errors import InputError
from dtppo.launch.launcher import absolute_paths, build_launcher, launch, run_rank
from dtppo.launch.preflight import preflight
from dtppo.observability.report import RunResults, run_results
from dtppo.ppo.entry import ppo_rank
from dtppo.ppo.trainer import PPOLoop, RunLog
from dtppo.rewards.validation import EvalResult
from dtppo.sft.trainer import check_floor, saved_results, sft_is_done, sft_rank
from dtppo.usercode.given import NOTHING_GIVEN, GivenInputs


def load_config(recipe: str | Path | Mapping[str, Any], overrides: Sequence[str] = ()) -> Config:
    """The recipe (a YAML path, or a mapping of the same form) with ``section.key=value`` overrides, as the command
    line reads them: typed, checked and frozen. A bad key or value raises ``dtppo.errors.ConfigError`` with the
    command line's one-line message."""
    return config_lib.load(recipe, overrides)


class PPOTrainer:
    """PPO (or GRPO) post-training from Python: ``train()`` the whole run, or ``step()`` one step at a time.

    ``reward_funcs``: callables in TRL's signature (``f(prompts, completions, **columns) -> list``; closures and
    lambdas too), or a mapping of names to them; they replace ``reward.functions`` (strings among them are specs
    as a recipe writes them). ``train_dataset`` / ``eval_dataset``: a ``datasets.Dataset`` or a list of dicts with
    the task's columns (``prompt`` for the custom task, as TRL's); they replace ``data.train`` / ``data.validation``,
    and every other column reaches the reward functions as a keyword list. ``callbacks``: objects with any of
    ``on_train_begin(config)``, ``on_step_end(step, metrics)``, ``on_validation_end(step, metrics)``,
    ``on_save(step, path)``, ``on_train_end(results)``, called with keywords in this process."""

    def __init__(
        self,
        config: Config,
        *,
        reward_funcs: RewardFuncs | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        callbacks: Iterable[Any] = (),
    ):
        if not isinstance(config, Config):
            raise TypeError(f"config: expected a dtppo Config (dtppo.load_config), got {type(config).__name__}")
        self.config, self.given = given_inputs(config, reward_funcs, train_dataset, eval_dataset)
        preflight(self.config, self.given)
        self._callbacks = Callbacks(callbacks)
        self.sft_results: dict[str, float] = {}
        self._loop: PPOLoop | None = None  # the run stepped in this process (``step``), until it ends
        self._run: RunLog | None = None
        self._rank = ExitStack()
        self._first_step = 0  # the history's first step of the current call to train or run of step
        self._results: RunResults | None = None  # the last run's, once it ended

    @property
    def history(self) -> list[dict[str, float]]:
        """The metrics of each step this trainer ran, in order (``validation/*`` in those that validated)."""
        return self._callbacks.history

    @property
    def in_process(self) -> bool:
        """Whether the run's rank is this process: one local rank, or this process is one of torchrun's."""
        return in_process(self.config.cluster)

    def train(self) -> RunResults:
        """The run to ``ppo.max_num_steps``: SFT first where the recipe asks and none is saved, then PPO, resumed
        from the latest checkpoint as the command line does; its results (what ``dtppo ppo``'s table shows)."""
        if self._loop is not None:  # stepped in this process: go on from there
            while self._loop.steps_done < self.config.ppo.max_num_steps:
                self.step()
            return self._results
        self._begin()
        tree = absolute_paths(self.config.to_dict())
        if self.in_process:
            run_on_ranks(self.config.cluster, ppo_rank, tree, self.given, self._callbacks)
        else:
            with EventListener(self._callbacks) as events:
                run_on_ranks(self.config.cluster, ppo_rank, tree, self.given, events)
        return self._finish()

    def step(self) -> dict[str, float]:
        """One PPO step in this process (the first call runs SFT where needed, resumes and validates the start as
        ``train`` does): its metrics, ``validation/*`` included when it validated. At ``ppo.max_num_steps`` the run
        ends (its log closed, ``on_train_end`` called) and a later ``step`` starts nothing."""
        loop, run = self._opened()
        if loop.steps_done >= self.config.ppo.max_num_steps:
            raise ConfigError(f"ppo.max_num_steps: the run has done its {loop.steps_done} steps; raise it to go on")
        try:
            metrics = loop.run_step(run)
        except BaseException:
            self.close()
            raise
        if loop.steps_done == self.config.ppo.max_num_steps:
            self._end_run(finished=True)
            self._finish()
        return metrics

    def evaluate(self) -> EvalResult:
        """The policy's answers to the validation problems, scored as in training: the run being stepped here, or
        the latest checkpoint (the starting policy where there is none), in this process."""
        if self._loop is not None:
            return dataclasses.replace(self._loop.evaluate(), step=self._loop.steps_done)
        tree = self.config.to_dict()
        # Evaluation samples in this one process: no generation ranks, nothing to run ahead of.
        tree["cluster"] |= {"generation_ranks": 0}
        tree["ppo"] |= {"max_lag": 0}
        cfg = config_lib.from_dict(tree)
        if cfg.ppo.init_from_sft and not sft_is_done(cfg):
            raise InputError(f"sft.output_dir: no SFT model at {cfg.sft.output_dir} (ppo.init_from_sft is true)")
        with this_process_as_rank():
            loop = PPOLoop(cfg, self.given)
            try:
                loop.maybe_resume()
                return dataclasses.replace(loop.evaluate(), step=loop.steps_done)
            finally:
                loop.close()

    def save_model(self, out_dir: str | Path) -> list[Path]:
        """Write the run's latest checkpoint (after saving the step reached here, when stepping) as HF models,
        ``out_dir/policy`` and ``out_dir/critic``, as ``dtppo export`` does; the paths written."""
        ckpt = self.config.checkpointing
        if not ckpt.enabled:
            raise ConfigError("checkpointing.enabled: save_model writes the run's latest checkpoint, and it has none")
        if self._loop is not None and store.latest_step(ckpt.checkpoint_dir) != self._loop.steps_done:
            path = self._loop.save()
            self._callbacks.saved(self._loop.steps_done, path)
        return export_checkpoint(ckpt.checkpoint_dir, out_dir)

    def close(self) -> None:
        """End a run being stepped here before its last step (its log closed as unfinished); nothing otherwise."""
        self._end_run(finished=False)

    def __enter__(self) -> PPOTrainer:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _opened(self) -> tuple[PPOLoop, RunLog]:
        if self._loop is None:
            if not self.in_process:
                raise ConfigError(
                    f"cluster: step() runs the loop in this process, and this run has {_ranks(self.config.cluster)}: "
                    "use train()"
                )
            self._begin()
            self._rank.enter_context(this_process_as_rank())
            self._loop = PPOLoop(self.config, self.given)
            self._run = self._loop.open_run(self._callbacks)
        return self._loop, self._run

    def _begin(self) -> None:
        """A run's start, stepped or trained: SFT first where needed, then ``on_train_begin``."""
        self._first_step = len(self.history)
        self.sft_results = self._sft_first()
        self._callbacks.train_begin(self.config)

    def _finish(self) -> RunResults:
        """A run's end: its results, read from its log, kept for ``train`` and given to ``on_train_end``."""
        self._results = self._read_results()
        self._callbacks.train_end(self._results)
        return self._results

    def _end_run(self, finished: bool) -> None:
        if self._loop is not None:
            loop, self._loop = self._loop, None
            loop.close_run(self._run, finished)
            self._run = None
            self._rank.close()

    def _sft_first(self) -> dict[str, float]:
        """The SFT model's results where PPO starts from one: trained first where none is saved."""
        cfg = self.config
        if not cfg.ppo.init_from_sft:
            return {}
        if sft_is_done(cfg):
            results = saved_results(cfg)
        elif under_torchrun():
            raise InputError(f"sft.output_dir: {cfg.sft.output_dir} is missing: run `dtppo sft` before launching ranks")
        else:
            config_lib.check_sft(cfg)
            print(f"no SFT checkpoint at {cfg.sft.output_dir}: running SFT first", flush=True)
            results = train_sft(cfg, self.given)
        check_floor(results, cfg)
        return results

    def _read_results(self) -> RunResults:
        reward_is_the_figure = self.config.reward.accuracy_from is None
        history = self.history[self._first_step :]
        return run_results(self.config.logger.log_dir, self.sft_results, history, reward_is_the_figure)


def train_sft(cfg: Config, given: GivenInputs = NOTHING_GIVEN) -> dict[str, float]:
    """SFT on the policy's ranks (``sft.run_sft``); the results it saved with the model."""
    cluster, policy_ranks = cfg.cluster, len(cfg.cluster.pool("policy"))
    if policy_ranks != cluster.world_size:  # the critic's or the generation ranks have no part in SFT
        cluster = dataclasses.replace(
            cluster, num_nodes=1, workers_per_node=policy_ranks, policy_ranks=0, generation_ranks=0
        )
    run_on_ranks(cluster, sft_rank, absolute_paths(cfg.to_dict()), given)
    return saved_results(cfg)


def run_on_ranks(cluster: ClusterConfig, fn: Callable[..., None], tree: dict, given: GivenInputs, *args) -> None:
    """``fn(tree, given, *args)`` on ``cluster``'s ranks: called here when the rank is this process (its errors
    raised as they are), else in the launched ranks (each stop printed there, raised here by its class), once
    ``given`` is known to travel."""
    if in_process(cluster):
        launch(build_launcher(cluster), fn, tree, given, *args)
        return
    given.check_portable(f"the {_ranks(cluster)}")
    launch(build_launcher(cluster), run_rank, fn, tree, given, *args)


def in_process(cluster: ClusterConfig) -> bool:
    """Whether a run on ``cluster`` runs its rank in this process: one local rank, or this is a torchrun rank."""
    return under_torchrun() or (cluster.backend == "local" and cluster.world_size == 1)


def _ranks(cluster: ClusterConfig) -> str:
    return f"{cluster.world_size} ranks (cluster.backend {cluster.backend})"
