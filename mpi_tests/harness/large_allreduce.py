"""Run by test_hardening_faults.py (CCL_TEST_LARGE=1), never collected: messages over 2 GiB.

``python -m mpi4py large_allreduce.py allreduce CODEC ALGORITHM`` allreduces
2^29 + 7 float32 elements (2 GiB + 28 bytes) per rank and checks every
element: the inputs are small integers, exact in fp16 and in every partial
sum, so the result must equal the exact sum bitwise.

``python -m mpi4py large_allreduce.py transport`` sends single byte payloads
of 2^31 + 40 bytes through the channel's point-to-point, broadcast and
allgather paths (counts and displacements past ``INT_MAX``: MPI-4 large-count
calls). Each rank prints ``exact`` and its peak RSS.
"""

import resource
import sys
import time

import numpy as np
from mpi4py import MPI

import ccl
from ccl import transport

comm = MPI.COMM_WORLD
p, rank = comm.size, comm.rank
BLOCK = 1 << 24


def peak_gib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def check_allreduce(codec, algorithm):
    n = 2**29 + 7
    pattern = np.arange(5, dtype=np.float32) + rank
    x = np.resize(pattern, n)
    assert x.nbytes > 2**31
    start = time.perf_counter()
    y = ccl.compressed_allreduce(x, codec, comm=comm, algorithm=algorithm)
    seconds = time.perf_counter() - start
    del x
    assert y.shape == (n,) and y.dtype == np.float32
    ranks_sum = p * (p - 1) / 2
    for lo in range(0, n, BLOCK):
        hi = min(lo + BLOCK, n)
        expected = p * (np.arange(lo, hi) % 5) + ranks_sum
        assert np.array_equal(y[lo:hi], expected), f"rank {rank}: wrong sum in [{lo}, {hi})"
    return f"{codec}/{algorithm} of {n * 4} bytes in {seconds:.0f} s"


def check_transport():
    n = 2**31 + 40
    ch = transport.channel(comm)
    with ch.collective("large-count check", None):
        mine = np.full(n, rank + 1, np.uint8)
        other = (rank + 1) % p
        got = ch.sendrecv(mine, other, (rank - 1) % p, 5)
        assert got.size == n and got[0] == got[-1] == (rank - 1) % p + 1
        del got
        got = ch.bcast(mine if rank == 0 else np.empty(0, np.uint8), root=0)
        assert got.size == n and got[-1] == 1
        del got
        # allgather: rank 0 contributes the big block, so later displacements pass INT_MAX
        blocks = ch.allgather(mine if rank == 0 else np.full(3, rank + 1, np.uint8))
        assert blocks[0].size == n and blocks[0][-1] == 1
        assert all(blocks[r].size == 3 and blocks[r][-1] == r + 1 for r in range(1, p))
    return f"payloads of {n} bytes (sendrecv, bcast, allgather)"


if sys.argv[1] == "transport":
    what = check_transport()
else:
    what = check_allreduce(sys.argv[2], sys.argv[3])
print(f"rank {rank}: exact, {what}, peak RSS {peak_gib():.1f} GiB", flush=True)
