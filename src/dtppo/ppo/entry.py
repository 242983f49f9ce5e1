"""What one rank of `dtppo ppo` runs: a training rank (the PPO loop, then rank 0 prints the results table) or a
generation rank (``cluster.generation_ranks``), which serves the training ranks until they are done."""

from __future__ import annotations

from dtppo.config import from_dict
from dtppo.distributed.comm import is_main_rank
from dtppo.distributed.ranks import run_worlds
from dtppo.generation.remote import serve
from dtppo.observability.report import results_table
from dtppo.ppo.trainer import PPOTrainer


def ppo_rank(tree: dict, sft_results: dict) -> None:
    """One rank of a PPO run: a training rank, or a generation rank (``cluster.generation_ranks``), which serves the
    training ranks until they are done."""
    cfg = from_dict(tree)
    worlds = run_worlds()
    if worlds is not None and worlds.generation_rank is not None:
        serve(cfg.policy, cfg.cluster, cfg.policy_init_path, cfg.ppo.seed, cfg.data.max_prompt_tokens)
        return
    history = PPOTrainer(cfg).fit()
    if is_main_rank():
        print(results_table(cfg.logger.log_dir, sft_results, history, cfg.reward.accuracy_from is None), flush=True)
