"""Run by test_cluster.py on an emulated cluster, never collected: one checked ccl allreduce.

``python -m mpi4py cluster_allreduce.py SIZE N``: fails (and so aborts the
job) unless there are SIZE ranks and an fp16 ring allreduce of N float32
elements equals the exact sum. The inputs are small integers, exact in fp16
and in every partial sum, so "equals" means bitwise.
"""

import sys

import numpy as np
from mpi4py import MPI

import ccl

expected_size, n = int(sys.argv[1]), int(sys.argv[2])
comm = MPI.COMM_WORLD
assert comm.size == expected_size, f"comm.size is {comm.size}, expected {expected_size}"


def rank_input(rank):
    return ((np.arange(n) + rank) % 17).astype(np.float32)


y = ccl.compressed_allreduce(rank_input(comm.rank), "fp16", comm=comm, algorithm="ring")
exact = sum(rank_input(r).astype(np.float64) for r in range(comm.size))
assert np.array_equal(y, exact), f"rank {comm.rank}: max error {np.abs(y - exact).max()}"
print(f"rank {comm.rank} of {comm.size}: exact", flush=True)
