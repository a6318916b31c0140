"""Every registered codec through every algorithm: the design's semantics hold for all.

Parametrised over the registry, so a codec that lands is covered by adding
its module; nothing here names a codec.
"""

import numpy as np
import pytest
from mpi4py import MPI

import ccl
from ccl.codecs import get_codec, registered_codecs
from ccl.testing import assert_same_on_all_ranks, exact_sum, rank_input

pytestmark = pytest.mark.mpi

CODECS = [c for c in registered_codecs() if c not in ("none", "fp16", "bf16")]
ALGORITHMS = ["ring", "tree", "direct", "allgather"]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("codec", CODECS)
def test_replica_consistency_and_shape(comm, codec, algorithm):
    for n in (0, 1, comm.size + 1, 10007):
        x = rank_input(comm.rank, n).reshape(-1, 1) if n else rank_input(comm.rank, 0)
        y = ccl.compressed_allreduce(x, codec, comm=comm, algorithm=algorithm)
        assert y.shape == x.shape and y.dtype == np.float32
        assert np.isfinite(y).all()
        assert_same_on_all_ranks(comm, y)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("codec", CODECS)
def test_error_feedback_conservation(comm, codec, algorithm):
    """delivered + residuals held == sum of inputs, over 50 steps."""
    if not get_codec(codec).error_feedback:
        pytest.skip("codec keeps no residuals")
    n, steps = 2003, 50
    c = ccl.Communicator(comm, codec=codec, algorithm=algorithm, min_compress_bytes=0)
    delivered, put_in = np.zeros(n), np.zeros(n)
    for step in range(steps):
        delivered += c.allreduce(rank_input(comm.rank, n, step=step), key="w")
        put_in += exact_sum(comm.size, n, step=step)
    held = comm.allreduce(c.feedback.get("w").held(n), op=MPI.SUM)
    scale = np.abs(put_in).max()
    np.testing.assert_allclose(delivered + held, put_in, atol=2e-5 * scale * steps)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("codec", CODECS)
def test_nonfinite_chunk_is_nan_everywhere_and_residuals_unpoisoned(comm, codec, algorithm):
    n = 3000
    c = ccl.Communicator(comm, codec=codec, algorithm=algorithm, min_compress_bytes=0)
    c.allreduce(rank_input(comm.rank, n, step=1), key="k")
    x = rank_input(comm.rank, n)
    if comm.rank == 0:
        x[5] = np.nan
    y = c.allreduce(x, key="k")
    assert_same_on_all_ranks(comm, y)
    assert np.isnan(y[5])
    state = c.feedback.get("k")
    if state is not None and state.residuals:
        assert np.isfinite(state.held(n)).all()


@pytest.mark.parametrize("algorithm", ["ring", "direct"])
@pytest.mark.parametrize("codec", CODECS)
def test_reduce_scatter_block(comm, codec, algorithm):
    n = 4001
    block = ccl.reduce_scatter(rank_input(comm.rank, n), codec, comm=comm, algorithm=algorithm)
    expected = np.array_split(exact_sum(comm.size, n), comm.size)[comm.rank]
    assert block.shape == expected.shape and np.isfinite(block).all()


@pytest.mark.parametrize("codec", CODECS)
def test_allgather_blocks(comm, codec):
    lengths = [(7 * r) % 11 for r in range(comm.size)]
    full = ccl.allgather(rank_input(comm.rank, lengths[comm.rank]), codec, comm=comm)
    assert full.shape == (sum(lengths),)
    assert_same_on_all_ranks(comm, full)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.mpi(min_size=2)
def test_codec_mismatch_raises_on_every_rank(comm, codec):
    spec = codec if comm.rank else "fp16"
    with pytest.raises(ccl.MismatchError, match="codec"):
        ccl.compressed_allreduce(np.ones(100, np.float32), spec, comm=comm, algorithm="ring")
