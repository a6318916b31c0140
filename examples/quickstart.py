"""Quick start: a compressed allreduce in an mpi4py program.

Run on 4 ranks (any number works)::

    mpiexec -n 4 python -m mpi4py examples/quickstart.py
"""

import zlib

import numpy as np
from mpi4py import MPI

import ccl

comm = MPI.COMM_WORLD
# every rank holds its own "gradient": one million float32 values
grad = np.random.default_rng(comm.rank).standard_normal(1_000_000).astype(np.float32)

# the average over all ranks, sent as fp16 around a ring
avg = ccl.compressed_allreduce(grad, "fp16", comm=comm, op="mean", algorithm="ring")

# the same average by MPI itself, uncompressed, to compare
exact = np.empty_like(grad)
comm.Allreduce(grad, exact)
exact /= comm.size
error = float(np.abs(avg - exact).max())
assert error < 1e-2, error

# every rank holds bitwise the same result
digests = comm.allgather(zlib.crc32(avg.tobytes()))
assert len(set(digests)) == 1

if comm.rank == 0:
    print(f"fp16 ring allreduce on {comm.size} ranks: max error vs MPI_Allreduce {error:.1e}")
