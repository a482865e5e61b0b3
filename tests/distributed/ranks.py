"""Running a test body on several gloo ranks: ``run(fn, *args)`` spawns ``world``
processes (torch.multiprocessing, the spawn method), each joining one process group on a
free local port; an assertion failing in any rank fails the test with its traceback."""
from __future__ import annotations

import os
import socket

import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn, args):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
        # no rank tears its group down while another still has collectives in flight
        # (gloo aborts the process: "terminate called without an active exception")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run(fn, *args, world: int = 2) -> None:
    mp.spawn(_entry, args=(world, _free_port(), fn, args), nprocs=world, join=True)
