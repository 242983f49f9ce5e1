"""The run sections (``dtppo.config.run``): logging, trackers, checkpoints and the cluster refuse a bad value naming
its key."""

from __future__ import annotations

import pytest

from tests.support.bad_configs import assert_refused, ids

BAD = [
    ("bad choice", ["cluster.backend=slurm"], "cluster.backend"),
    ("range", ["checkpointing.save_period=0"], "checkpointing.save_period"),
    ("output path", ["logger.log_dir=''"], "logger.log_dir"),
    ("parallel layout", ["cluster.policy_ranks=1"], "cluster.policy_ranks"),
    ("parallel layout", ["cluster.num_nodes=0"], "cluster.num_nodes"),
    ("async", ["cluster.generation_ranks=1"], "cluster.generation_ranks"),
    ("async", ["cluster.workers_per_node=2", "cluster.generation_ranks=-1"], "cluster.generation_ranks"),
    (
        "async",
        ["cluster.workers_per_node=3", "cluster.generation_ranks=1", "cluster.policy_ranks=2"],
        "cluster.policy_ranks",
    ),
    ("async", ["cluster.workers_per_node=2", "cluster.generation_timeout_s=0"], "cluster.generation_timeout_s"),
    ("trackers", ["logger.wandb.mode=cloud"], "logger.wandb.mode"),
    ("trackers", ["logger.wandb.enabled=maybe"], "logger.wandb.enabled"),
    ("trackers", ["logger.wandb.project=''"], "logger.wandb.project"),
    ("trackers", ["logger.mlflow.experiment=' '"], "logger.mlflow.experiment"),
    ("trackers", ["logger.mlflow.tracking_uri=''"], "logger.mlflow.tracking_uri"),
]


@pytest.mark.parametrize("kind, overrides, key", BAD, ids=ids(BAD))
def test_a_bad_value_is_refused_naming_its_key(kind, overrides, key):
    assert_refused(kind, overrides, key)
