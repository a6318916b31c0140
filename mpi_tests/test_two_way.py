"""Two-way compression (BytePS-Compress): partitions, uncompressed small tensors, and
worker plus owner residuals in ``direct``."""

import numpy as np
import pytest
from mpi4py import MPI

import ccl
from ccl.testing import assert_same_on_all_ranks, exact_sum, rank_input

pytestmark = pytest.mark.mpi


def test_small_tensors_pass_through_uncompressed_bit_exactly(comm):
    c = ccl.Communicator(comm, codec="onebit", algorithm="direct", min_compress_bytes=65536)
    x = rank_input(comm.rank, 1000)  # 4000 bytes < 64 KiB
    y = c.allreduce(x, key="small")
    reference = np.empty_like(x)
    comm.Allreduce(x, reference)
    np.testing.assert_array_equal(y, reference)
    assert not c.feedback.get("small").residuals, "nothing was lossy, so nothing is held"


@pytest.mark.parametrize("algorithm", ["direct", "ring", "allgather"])
def test_partitions_have_their_own_residuals_and_conserve_mass(comm, algorithm):
    # 3 partitions of 1000 floats and a last one of 500 floats (2000 bytes), which is
    # below min_compress_bytes and therefore exact
    n, steps = 3500, 30
    c = ccl.Communicator(comm, codec="onebit", algorithm=algorithm, partition_bytes=4000,
                         min_compress_bytes=3000)
    delivered, put_in = np.zeros(n), np.zeros(n)
    for step in range(steps):
        y = c.allreduce(rank_input(comm.rank, n, step=step), key="w")
        assert_same_on_all_ranks(comm, y)
        delivered += y
        put_in += exact_sum(comm.size, n, step=step)
    state = c.feedback.get("w")
    held = comm.allreduce(state.held(n), op=MPI.SUM)
    np.testing.assert_allclose(delivered + held, put_in, atol=1e-3)
    ranges = sorted({(start, stop) for start, stop, _ in state.residuals.values()})
    assert ranges[0][0] == 0 and max(stop for _, stop in ranges) == 3000
    assert all(stop <= 3000 for _, stop in ranges), "the exact tail holds no residual"
    # each partition holds residuals of its own (distinct chunk ids)
    assert len({point[1] for point in state.residuals}) >= 3
    # the uncompressed tail equals the exact sum of that step to float32 rounding
    np.testing.assert_allclose(y[3000:], exact_sum(comm.size, n, step=steps - 1)[3000:],
                               atol=1e-5)


def test_auto_decides_per_partition(comm):
    # auto sends pieces below its own 64 KiB threshold with MPI_Allreduce, uncompressed:
    # with 4000-byte partitions the whole tensor arrives exactly
    c = ccl.Communicator(comm, codec="onebit", partition_bytes=4000, min_compress_bytes=0)
    x = rank_input(comm.rank, 3500)
    reference = np.empty_like(x)
    comm.Allreduce(x, reference)
    np.testing.assert_array_equal(c.allreduce(x, key="a"), reference)


def test_worker_and_owner_residuals_stay_bounded_over_1000_steps(comm):
    """direct keeps a worker residual per sent chunk and an owner residual per owned chunk."""
    n = 1200
    c = ccl.Communicator(comm, codec="onebit", algorithm="direct", min_compress_bytes=0)
    rng = np.random.default_rng([11, comm.rank])
    largest = 0.0
    for _ in range(1000):
        c.allreduce(rng.standard_normal(n).astype(np.float32), key="g")
        largest = max(largest, max(float(np.abs(r).max()) for _, _, r in
                                   c.feedback.get("g").residuals.values()))
    roles = {point[0] for point in c.feedback.get("g").residuals}
    assert roles == ({"worker", "owner"} if comm.size > 1 else {"owner"})
    # residuals of a scaled sign with error feedback stay within a few input maxima
    # (inputs are N(0,1); owners hold sums of p of them)
    assert largest < 10 * comm.size


def test_knobs_are_validated(comm):
    with pytest.raises(ValueError, match="partition_bytes"):
        ccl.Communicator(comm, codec="onebit", partition_bytes=-1)


@pytest.mark.mpi(min_size=2)
def test_knobs_must_agree(comm):
    c = ccl.Communicator(comm, codec="onebit",
                         partition_bytes=4000 if comm.rank == 0 else 8000)
    with pytest.raises(ccl.MismatchError, match="algorithm"):
        c.allreduce(rank_input(comm.rank, 5000), key="k")
