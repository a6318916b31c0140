"""Save every scenario's checkpoint in the format of the code at hand, at two ranks.

Run from the repository root::

    mpiexec -n 2 python -m mpi4py -m mpi_tests.checkpoints.make_fixtures v2

It writes ``mpi_tests/checkpoints/<folder>/<scenario>-rank<r>.pt``. Files of
a released format version stay as they are: every later version must load
them (``mpi_tests/test_checkpoint.py``). ``v1`` was written by the code
before ``ccl.torch.checkpoint`` existed (commit 5f04827), where each object
had a format of its own.
"""

import os
import socket
import sys

import torch
import torch.distributed as dist
from mpi4py import MPI

import ccl.torch as ct

from mpi_tests.checkpoints.scenarios import BEFORE, MORE, NAMES, Run


def main(folder):
    world = MPI.COMM_WORLD
    if world.size != 2:
        raise SystemExit("run it at two ranks: mpiexec -n 2 ...")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), folder)
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    if world.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = world.bcast(port if world.rank == 0 else None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=world.rank,
                            world_size=world.size)
    for name in NAMES:
        ct.init(world.Dup())
        run = Run(name)
        run.train(BEFORE)
        saved = run.save()
        run.train(MORE, start=BEFORE)
        saved["after"] = run.flat()
        torch.save(saved, os.path.join(out, f"{name}-rank{world.rank}.pt"))
        ct.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "new")
