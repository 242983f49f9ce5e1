"""Start the ranks of a run: inside torchrun, as spawned local processes, or as the single process.

The same entry point runs everywhere: under torchrun (RANK/WORLD_SIZE set) each process joins the group
torchrun describes; otherwise ``cluster.workers_per_node`` > 1 spawns that many local ranks on 127.0.0.1.
CPU ranks use gloo and share the cores evenly; GPU ranks use nccl, one device each. A single CPU process runs
without a process group; a single GPU process joins a one-rank group (see ``run_ranks``).

With generation ranks (``cluster.generation_ranks`` = G > 0) the launched ranks form two worlds: the first
W − G train, the last G generate, and each world is the default process group of its own processes, so every
collective of the trainer (meshes, FSDP, checkpoints) stays among the training ranks exactly as without
generation ranks. The two worlds meet only through ``distributed.bridge``, built from the run's rendezvous store
(``run_store``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


@dataclass(frozen=True)
class RunWorlds:
    """This process's place in a run with generation ranks: the rendezvous store every launched rank shares, its
    rank among all of them, and how many train."""

    store: dist.Store
    global_rank: int
    world_size: int
    training_ranks: int

    @property
    def generation_rank(self) -> int | None:
        """This rank's index among the generation ranks, None on a training rank."""
        index = self.global_rank - self.training_ranks
        return index if index >= 0 else None


_WORLDS: RunWorlds | None = None  # set once per process by _run_in_group, like torch's own default group


def run_worlds() -> RunWorlds | None:
    """The run's two worlds as this process sees them; None without generation ranks."""
    return _WORLDS


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def run_ranks(
    fn: Callable[..., None], world_size: int, *args, generation_ranks: int = 0, preload: tuple[str, ...] = ()
) -> None:
    """Call ``fn(*args)`` once per rank with the process group initialised (none for a single CPU process); the
    last ``generation_ranks`` ranks get a world of their own (module docstring).

    Local ranks are forked from a server process that imported torch, transformers, ``fn``'s module and the modules
    in ``preload`` once (multiprocessing's forkserver, started at this process's first launch): a process that
    launches ranks again (a benchmark, a test session) starts them without importing the stack each time. Each rank
    then takes this process's working directory and environment as they are at the launch, as a spawned
    interpreter would."""
    if under_torchrun():
        if int(os.environ["WORLD_SIZE"]) != world_size:
            raise ValueError(
                f"cluster.num_nodes * cluster.workers_per_node = {world_size}, but torchrun "
                f"started {os.environ['WORLD_SIZE']} ranks"
            )
        _run_in_group(fn, args, generation_ranks)
    elif world_size == 1:
        with this_process_as_rank():
            fn(*args)
    else:
        port = _free_port()
        context = mp.get_context("forkserver")
        context.set_forkserver_preload(["torch", "transformers", fn.__module__, *preload])  # once: at its start
        launching = (os.getcwd(), dict(os.environ))
        ranks = mp.start_processes(
            _spawned_rank,
            args=(world_size, port, fn, args, generation_ranks, launching),
            nprocs=world_size,
            join=False,
            start_method="forkserver",
        )
        _join_or_stop(ranks)


@contextlib.contextmanager
def this_process_as_rank() -> Iterator[None]:
    """This process as a run's only rank. On a GPU it joins a one-rank group, so its models are FSDP2-wrapped with
    the same bf16-parameter / fp32-reduction policy as a multi-rank run, not trained in plain fp32; on CPU (or in a
    group already) nothing changes."""
    if not torch.cuda.is_available() or dist.is_initialized():
        yield
        return
    group = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    before = {name: os.environ.get(name) for name in group}
    os.environ.update(group)
    torch.cuda.set_device(0)
    dist.init_process_group("cpu:gloo,cuda:nccl")
    try:
        yield
    finally:
        dist.destroy_process_group()
        for name, value in before.items():  # this process is no torchrun rank afterwards (``under_torchrun``)
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _join_or_stop(ranks: mp.ProcessContext) -> None:
    """Wait for the spawned ranks; if this process is stopped first (SIGTERM, as from a container runtime or
    `timeout`, or Ctrl-C), stop them too: their parent is the forkserver, so they would otherwise run on."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main_thread else None
    try:
        while not ranks.join():
            pass
    except BaseException:
        for process in ranks.processes:
            if process.is_alive():
                process.terminate()
        for process in ranks.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
        raise
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


def _spawned_rank(
    local_rank: int,
    world_size: int,
    port: int,
    fn: Callable[..., None],
    args: tuple,
    generation_ranks: int,
    launching: tuple[str, dict[str, str]],
) -> None:
    cwd, environ = launching  # the launching process's, now: the forkserver holds those of its own start
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(local_rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world_size),
    )
    _run_in_group(fn, args, generation_ranks)
    # Finished: results written, groups destroyed. Leave without the interpreter's teardown, where destroying
    # C++ objects that still own a thread (rank 0 hosts the rendezvous store's server) has aborted a finished
    # rank in CI ("terminate called without an active exception", SIGABRT) and failed a run that had succeeded.
    # A rank that raised never gets here: the launcher reports its exception as before.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _run_in_group(fn: Callable[..., None], args: tuple, generation_ranks: int = 0) -> None:
    world_size, local_rank = int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        # nccl for the models' CUDA tensors, gloo for what stays on the CPU (the step's batch, metrics, objects).
        backend = "cpu:gloo,cuda:nccl"
    else:
        # The machine's cores shared among its ranks, unless OMP_NUM_THREADS says otherwise (the vllm backend
        # sets 1 on CPU, cli.py).
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        shared = max(1, (os.cpu_count() or 1) // local_world)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 0) or shared)
        backend = "gloo"
    if generation_ranks == 0:
        dist.init_process_group(backend)
    else:
        _init_two_worlds(backend, world_size, generation_ranks)
    fn(*args)
    # Leave together: a rank that tears down gloo while a peer is still connected (separate pools finish at
    # different moments) can abort its peer at exit. A failing rank skips this; the launcher stops the rest.
    dist.barrier()
    dist.destroy_process_group()


def _init_two_worlds(backend: str, world_size: int, generation_ranks: int) -> None:
    """Join this rank's world (training or generation) as its default group, over a prefix of the run's store."""
    global _WORLDS
    store, global_rank, _ = next(dist.rendezvous("env://"))
    training = world_size - generation_ranks
    if global_rank >= training:
        name, rank, size = "generation", global_rank - training, generation_ranks
    else:
        name, rank, size = "training", global_rank, training
    dist.init_process_group(backend, store=dist.PrefixStore(name, store), rank=rank, world_size=size)
    _WORLDS = RunWorlds(store, global_rank, world_size, training)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
