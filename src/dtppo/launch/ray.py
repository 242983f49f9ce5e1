"""The Ray RankLauncher: one placement-group bundle and one actor per rank.

Ray wraps ranks, not workers: an actor is a whole SPMD rank (the plain ``RayRank`` class; ``ray.remote`` is
applied here, where the actors are spawned), which then builds its policy and critic workers like a local rank.
Ranks form the torch.distributed group over their node addresses (gloo on CPU, nccl on GPU). Generation ranks
(``cluster.generation_ranks``) are an actor group of their own, in a placement group of their own, so a cluster
can give them other nodes than the training ranks'.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from dtppo.config import ClusterConfig
from dtppo.errors import GenerationError

PEER_REPORT_S = 60.0  # how long the other ranks of a deliberately stopped run get to print their line
LOG_FORWARD_S = 1.0


class RankStopped(RuntimeError):
    """A rank ended the run on purpose (non-finite streak, checkpoint fault) and printed why; ``exit_code`` is
    the code the driver exits with, as a local run's would."""

    def __init__(self, rank: int, exit_code: int):
        super().__init__(f"rank {rank} stopped the run (exit {exit_code})")
        self.exit_code = exit_code


class RayRank:
    """One rank in a Ray actor: reports where it runs, then joins the process group and runs the SPMD function."""

    def address(self) -> tuple[str, int, str]:
        """(node IP, a free port on it, Ray node id)."""
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return ray.util.get_node_ip_address(), port, ray.get_runtime_context().get_node_id()

    def run(
        self,
        fn: Callable[..., None],
        args: tuple,
        rank: int,
        world_size: int,
        master: tuple[str, int],
        local_world_size: int,
        generation_ranks: int,
    ) -> int:
        """The rank's exit code: 0, or the code of a deliberate stop (the actor itself stays up for the driver
        to kill, so a SystemExit must come back as a value, not end the actor)."""
        from dtppo.distributed.ranks import _run_in_group

        os.environ.update(
            MASTER_ADDR=master[0],
            MASTER_PORT=str(master[1]),
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE=str(local_world_size),
        )
        if master[0].startswith("127."):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        try:
            _run_in_group(fn, args, generation_ranks)
        except SystemExit as stop:
            return stop.code if isinstance(stop.code, int) else 1
        return 0


class RayLauncher:
    """Attach to ``cluster.ray_address`` (or RAY_ADDRESS), else start a local Ray instance for this run."""

    def __init__(self, cluster: ClusterConfig, temp_dir: str | Path):
        import ray

        self.world_size = world_size = cluster.world_size
        self.generation_ranks = cluster.generation_ranks
        address = cluster.ray_address or os.environ.get("RAY_ADDRESS")
        self._started_ray = not ray.is_initialized()
        if self._started_ray:
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            if address is None:
                # A private local instance, session files under the run. Its GCS and raylet listen on every
                # interface (Ray has no loopback-only option; the node IP is only the address it advertises), so
                # it keeps the token auth Ray (>= 2.59) turns on for local instances, with a fresh random token:
                # the processes Ray starts inherit it from this environment, and it is never written to disk.
                # RAY_AUTH_MODE stays as the user set it (Ray has read it already). Ray's notice about its
                # default ends "set RAY_AUTH_MODE=disabled to opt out", which is not advice to give here.
                os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
                logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
                ray.init(
                    num_cpus=max(world_size, os.cpu_count() or 1),
                    include_dashboard=False,
                    _node_ip_address="127.0.0.1",
                    _temp_dir=str(Path(temp_dir).resolve()),
                    log_to_driver=True,
                )
            else:
                ray.init(address=address, log_to_driver=True)
        self.placement_groups, self.actors = [], []
        for size in (cluster.training_ranks, cluster.generation_ranks):  # the training group, the generation group
            if size:
                self.actors += self._actor_group(size, cluster)
        self.addresses = ray.get([a.address.remote() for a in self.actors], timeout=cluster.ray_timeout_s)

    def _actor_group(self, size: int, cluster: ClusterConfig) -> list:
        """``size`` rank actors, one per bundle of a placement group of their own."""
        import ray
        from ray.util.placement_group import placement_group

        gpu = bool(ray.cluster_resources().get("GPU"))
        bundle = {"CPU": 1, "GPU": 1} if gpu else {"CPU": 1}
        group = placement_group([bundle] * size, strategy=cluster.ray_placement.upper())
        ray.get(group.ready(), timeout=cluster.ray_timeout_s)
        self.placement_groups.append(group)
        remote = ray.remote(RayRank)
        return [
            remote.options(
                num_cpus=1,
                num_gpus=1 if gpu else 0,
                name=None,
                scheduling_strategy=ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=i
                ),
            ).remote()
            for i in range(size)
        ]

    def run(self, fn: Callable[..., None], *args) -> None:
        import ray

        per_node = Counter(node for _, _, node in self.addresses)
        master = self.addresses[0][:2]
        if all(ip == ray.util.get_node_ip_address() for ip, _, _ in self.addresses):
            master = ("127.0.0.1", master[1])  # every rank on this host: keep the group on loopback
        refs = [
            actor.run.remote(
                fn, args, rank, self.world_size, master, per_node[self.addresses[rank][2]], self.generation_ranks
            )
            for rank, actor in enumerate(self.actors)
        ]
        pending = dict(zip(refs, range(self.world_size)))
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in done:
                rank = pending.pop(ref)
                try:
                    code = ray.get(ref)
                except Exception as err:  # an actor died or raised: stop the whole run now, naming it
                    self.shutdown()
                    first_generation = self.world_size - self.generation_ranks
                    side = f"generation rank {rank - first_generation}, " if rank >= first_generation else ""
                    message = (
                        f"rank {rank} ({side}Ray actor on {self.addresses[rank][0]}) failed: "
                        f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                    )
                    raise (GenerationError(message) if side else RuntimeError(message)) from None
                if code != 0:
                    self._let_peers_report(list(pending))
                    self.shutdown()
                    raise RankStopped(rank, code)

    def _let_peers_report(self, refs: list) -> None:
        """A deliberate stop is collective (every rank stops at the same step and prints its one line), and the
        first rank back may be the one with the least to do: killing its peers then would cut their lines off."""
        import ray

        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=PEER_REPORT_S)

    def rank_nodes(self) -> list[str]:
        """``ip/node-id`` of every rank, in rank order."""
        return [f"{ip}/{node[:8]}" for ip, _, node in self.addresses]

    def shutdown(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        if not ray.is_initialized():
            return
        # Ray's log monitor polls the actors' log files every 0.1 s; what the ranks printed last (the results
        # table, a stop's line) reaches this driver only if Ray is still up when it is read.
        time.sleep(LOG_FORWARD_S)
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        for group in self.placement_groups:
            remove_placement_group(group)
        time.sleep(0.1)
        if self._started_ray:
            ray.shutdown()
