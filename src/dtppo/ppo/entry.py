"""What one rank of a PPO run runs: a training rank (the PPO loop) or a generation rank (``cluster.generation_ranks``),
which serves the training ranks until they are done."""

from __future__ import annotations

from dtppo.config import from_dict
from dtppo.distributed.ranks import run_worlds
from dtppo.generation.remote import serve
from dtppo.ppo.trainer import PPOLoop, RunEvents
from dtppo.usercode.given import NOTHING_GIVEN, GivenInputs


def ppo_rank(tree: dict, given: GivenInputs = NOTHING_GIVEN, events: RunEvents | None = None) -> None:
    """One rank of a PPO run (the config as a plain tree: what a launcher hands a rank; ``given``: the reward
    functions and rows passed in Python): a training rank, whose rank 0 tells ``events`` of each step, or a
    generation rank, which serves the training ranks until they are done."""
    cfg = from_dict(tree)
    worlds = run_worlds()
    if worlds is not None and worlds.generation_rank is not None:
        serve(cfg.policy, cfg.cluster, cfg.policy_init_path, cfg.ppo.seed, cfg.data.max_prompt_tokens)
        return
    PPOLoop(cfg, given).fit(events)
