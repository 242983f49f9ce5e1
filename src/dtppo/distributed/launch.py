"""Start the ranks of a run: inside torchrun, as spawned local processes, or as the single process.

The same entry point runs everywhere: under torchrun (RANK/WORLD_SIZE set) each process joins the group
torchrun describes; otherwise ``cluster.workers_per_node`` > 1 spawns that many local ranks on 127.0.0.1.
CPU ranks use gloo and share the cores evenly; GPU ranks use nccl, one device each. A single CPU process runs
without a process group; a single GPU process joins a one-rank group (see ``run_ranks``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def run_ranks(fn: Callable[..., None], world_size: int, *args) -> None:
    """Call ``fn(*args)`` once per rank with the process group initialised (none for a single CPU process)."""
    if under_torchrun():
        if int(os.environ["WORLD_SIZE"]) != world_size:
            raise ValueError(
                f"cluster.num_nodes * cluster.workers_per_node = {world_size}, but torchrun "
                f"started {os.environ['WORLD_SIZE']} ranks"
            )
        _run_in_group(fn, args)
    elif world_size == 1 and torch.cuda.is_available():
        # One GPU process still joins a (one-rank) group: its models are then FSDP2-wrapped with the same
        # bf16-parameter / fp32-reduction policy as a multi-rank run, not trained in plain fp32.
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1"
        )
        _run_in_group(fn, args)
    elif world_size == 1:
        fn(*args)
    else:
        port = _free_port()
        mp.start_processes(
            _spawned_rank, args=(world_size, port, fn, args), nprocs=world_size, join=True, start_method="spawn"
        )


def _spawned_rank(local_rank: int, world_size: int, port: int, fn: Callable[..., None], args: tuple) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(local_rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world_size),
    )
    _run_in_group(fn, args)


def _run_in_group(fn: Callable[..., None], args: tuple) -> None:
    world_size, local_rank = int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        # nccl for the models' CUDA tensors, gloo for what stays on the CPU (the step's batch, metrics, objects).
        dist.init_process_group("cpu:gloo,cuda:nccl")
    else:
        # The machine's cores shared among its ranks, unless OMP_NUM_THREADS says otherwise (the vllm backend
        # sets 1 on CPU, cli.py).
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        shared = max(1, (os.cpu_count() or 1) // local_world)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 0) or shared)
        dist.init_process_group("gloo")
    fn(*args)
    # Leave together: a rank that tears down gloo while a peer is still connected (separate pools finish at
    # different moments) can abort its peer at exit. A failing rank skips this; the launcher stops the rest.
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
