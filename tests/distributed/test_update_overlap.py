"""In separate pools (``cluster.policy_ranks``) the critic's and the policy's updates run at the same time: every
update of an epoch starts before any result is shared (``PPOLoop._update``). Two gloo ranks, the real roles
and collectives, workers whose update takes a fixed wall time; a serial schedule is the negative control."""

import os
import tempfile
import time
from types import SimpleNamespace

import torch

from dtppo.distributed.comm import rank
from dtppo.distributed.ranks import run_ranks
from dtppo.observability.timing import PhaseTimer
from dtppo.ppo.trainer import PPOLoop
from dtppo.workers.role import PolicyRole, ValueRole

UPDATE_SECONDS = 1.0


class TimedWorker:
    """Stands in for a worker: its update sleeps, and returns when it started and ended."""

    def prepare_for_training(self) -> None:
        pass

    def finish_training(self) -> None:
        pass

    def train(self, experience) -> dict[str, torch.Tensor]:
        start = time.time()
        time.sleep(UPDATE_SECONDS)
        return {
            "start": torch.tensor(start, dtype=torch.float64),
            "end": torch.tensor(time.time(), dtype=torch.float64),
        }


def _serial_update(trainer, experience, train_policy, timer):
    """The schedule the structure rules out: each update shared as soon as it ends."""
    runs = {}
    for role, phase in [(trainer.value, "critic_update"), (trainer.policy, "policy_update")]:
        runs[phase] = [role.share(role.train(experience))]
    return runs


def _rank(out: str) -> None:
    me = rank()
    trainer = object.__new__(PPOLoop)  # only the roles and the epoch count: _update touches nothing else
    trainer.cfg = SimpleNamespace(ppo=SimpleNamespace(ppo_epochs=1), value=SimpleNamespace(updates_per_step=1))
    trainer.policy = PolicyRole(TimedWorker() if me == 0 else None, range(0, 1), colocated=False)
    trainer.value = ValueRole(TimedWorker() if me == 1 else None, range(1, 2), colocated=False)
    results = {
        "structured": trainer._update(None, True, PhaseTimer(torch.device("cpu"))),
        "serial": _serial_update(trainer, None, True, PhaseTimer(torch.device("cpu"))),
    }
    torch.save(results, f"{out}.{me}")


def _intervals(runs: dict) -> tuple[tuple[float, float], tuple[float, float]]:
    (critic,), (policy,) = runs["critic_update"], runs["policy_update"]
    return (float(critic["start"]), float(critic["end"])), (float(policy["start"]), float(policy["end"]))


def test_critic_and_policy_updates_overlap_in_separate_pools():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result")
        run_ranks(_rank, 2, out)
        by_rank = [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]
    # Both ranks hold both roles' statistics, shared from the pool that computed them.
    assert _intervals(by_rank[0]["structured"]) == _intervals(by_rank[1]["structured"])
    (c0, c1), (p0, p1) = _intervals(by_rank[0]["structured"])
    overlap = min(c1, p1) - max(c0, p0)
    assert overlap > 0.5 * UPDATE_SECONDS, (c0, c1, p0, p1)
    (c0, c1), (p0, p1) = _intervals(by_rank[0]["serial"])  # negative control: one after the other
    assert min(c1, p1) - max(c0, p0) < 0.1 * UPDATE_SECONDS, (c0, c1, p0, p1)
