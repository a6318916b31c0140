"""``ccl.testing``: the oracles give the right answers, and fail where they must."""

import numpy as np
import pytest
from mpi4py import MPI

import ccl
from ccl.testing import (
    CAST_ROUNDING, assert_same_on_all_ranks, cast_bound, conservation_tolerance, exact_sum,
    rank_input, same_on_all_ranks)


def test_rank_input_is_reproducible_and_independent():
    x = rank_input(2, 50, seed=1, step=3)
    assert x.dtype == np.float32 and x.shape == (50,)
    np.testing.assert_array_equal(x, rank_input(2, 50, seed=1, step=3))
    for other in (rank_input(1, 50, seed=1, step=3), rank_input(2, 50, seed=2, step=3),
                  rank_input(2, 50, seed=1, step=4)):
        assert not np.array_equal(x, other)
    assert rank_input(0, 7, dtype=np.float64).dtype == np.float64


@pytest.mark.mpi
def test_exact_sum_is_mpi_sum_of_every_rank_input(comm):
    x = rank_input(comm.rank, 301, seed=5, step=2).astype(np.float64)
    total = np.empty_like(x)
    comm.Allreduce(x, total, op=MPI.SUM)
    np.testing.assert_allclose(exact_sum(comm.size, 301, seed=5, step=2), total,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.mpi
def test_same_arrays_pass_on_every_rank(comm):
    for array in (np.arange(6.0), np.full(3, np.nan, np.float32), np.empty(0, np.float16)):
        assert same_on_all_ranks(comm, array)
        assert_same_on_all_ranks(comm, array)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", ["value", "nan payload", "shape", "dtype"])
def test_a_rank_that_differs_fails_on_every_rank(comm, kind):
    a = np.arange(6, dtype=np.float32)
    last = comm.rank == comm.size - 1
    if kind == "value":
        a[3] += np.float32(1e-6) if last else 0
    elif kind == "nan payload":  # NaNs with other bits: replicas are compared bitwise
        a.view(np.uint32)[2] = 0x7FC00001 if last else 0x7FC00000
    elif kind == "shape":
        a = a.reshape((2, 3) if last else (3, 2))  # the same bytes
    else:
        a = a.view(np.int32) if last else a
    assert not same_on_all_ranks(comm, a)
    with pytest.raises(AssertionError, match="results differ across ranks"):
        assert_same_on_all_ranks(comm, a)


@pytest.mark.mpi
def test_a_replicated_collective_result_passes(comm):
    y = ccl.compressed_allreduce(rank_input(comm.rank, 1000), "3lc", comm=comm)
    assert_same_on_all_ranks(comm, y)


@pytest.mark.parametrize("codec", sorted(CAST_ROUNDING))
def test_cast_bound_holds_for_the_cast_and_is_tight(codec):
    exact = np.random.default_rng(0).standard_normal(10000) * 100
    rounded = ccl.codecs.get_codec(codec).decode(ccl.codecs.get_codec(codec).encode(
        exact.astype(np.float32))).astype(np.float64)
    error = np.abs(rounded - exact)
    bound = cast_bound(codec, exact, np.abs(exact), p=1)
    assert (error <= bound).all()
    assert error.max() > bound.max() / 1000  # not so loose that it holds for anything


def test_conservation_tolerance_grows_with_calls_ranks_and_magnitude():
    base = conservation_tolerance(10, 3, 1.0)
    assert base > 0
    assert conservation_tolerance(20, 3, 1.0) == pytest.approx(2 * base)
    assert conservation_tolerance(10, 7, 1.0) == pytest.approx(2 * base)
    assert conservation_tolerance(10, 3, 8.0) == pytest.approx(8 * base)
    assert conservation_tolerance(0, 3, 1.0) == 0.0
