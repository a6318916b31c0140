"""algorithm="hierarchical": exact inside a node, compressed across nodes (CCL_LOCAL_SIZE
lays the nodes out on one machine). Layouts: 2x2, 2x3 (at 6 ranks: CI runs up to 5, so
also 1xN, Nx1 and uneven ones)."""

import numpy as np
import pytest
from mpi4py import MPI

import ccl
from ccl.codecs import get_codec, registered_codecs
from ccl.testing import assert_same_on_all_ranks, exact_sum, rank_input

CODECS = ["none", "fp16", "3lc", {"id": "thc", "bits": 4}, "topk"]


def _nodes(monkeypatch, size):
    monkeypatch.setenv("CCL_LOCAL_SIZE", str(size))


def _even_layouts(p):
    return [k for k in range(1, p + 1) if p % k == 0]


@pytest.mark.mpi
@pytest.mark.parametrize("codec", CODECS, ids=str)
def test_hierarchical_sums_like_the_flat_algorithms(comm, monkeypatch, codec):
    p = comm.size
    for local in _even_layouts(p):  # 1 rank per node ... 1 node of every rank
        _nodes(monkeypatch, local)
        mine = comm.Dup()  # a fresh channel: its nodes are read once
        try:
            for n in (0, 1, p - 1, 1009, 40_000):
                x = rank_input(comm.rank, n)
                y = ccl.compressed_allreduce(x, codec, comm=mine, algorithm="hierarchical")
                assert y.shape == x.shape and y.dtype == x.dtype
                assert_same_on_all_ranks(comm, y)
                exact = exact_sum(p, n)
                if codec in ("none", "fp16") and n:
                    np.testing.assert_allclose(y, exact, rtol=2e-3, atol=2e-3 * p)
        finally:
            mine.Free()


@pytest.mark.mpi(min_size=2)
def test_error_feedback_conserves_mass_across_nodes(comm, monkeypatch):
    p = comm.size
    _nodes(monkeypatch, _cross_nodes(p))
    mine = comm.Dup()
    try:
        c = ccl.Communicator(mine, codec="test-stepquant", algorithm="hierarchical",
                             min_compress_bytes=0, cross_algorithm="direct")
        n, delivered, put_in = 777, np.zeros(777), np.zeros(777)
        for step in range(20):
            delivered += c.allreduce(rank_input(comm.rank, n, step=step), key="w")
            put_in += exact_sum(p, n, step=step)
        held = comm.allreduce(c.feedback.get("w").held(n), op=MPI.SUM)
        np.testing.assert_allclose(delivered + held, put_in, atol=1e-3)
    finally:
        mine.Free()


@pytest.mark.mpi(min_size=3)
def test_uneven_nodes_raise_on_every_rank(comm, monkeypatch):
    p = comm.size
    local = 2 if p % 2 else 3 if p % 3 else None  # a last node smaller than the others
    if local is None:
        pytest.skip("every node size divides this rank count")
    _nodes(monkeypatch, local)
    mine = comm.Dup()
    try:
        with pytest.raises(ValueError, match="nodes of equal size"):
            ccl.compressed_allreduce(rank_input(comm.rank, 100), "3lc", comm=mine,
                                     algorithm="hierarchical")
        # auto does not pick it there, and the communicator works on
        y = ccl.compressed_allreduce(rank_input(comm.rank, 1 << 17), "3lc", comm=mine,
                                     key="k")
        assert_same_on_all_ranks(comm, y)
    finally:
        mine.Free()


@pytest.mark.mpi(min_size=4)
def test_auto_picks_hierarchical_on_nodes_of_several_ranks(comm, monkeypatch):
    if comm.size % 2:
        pytest.skip("needs nodes of two ranks")
    _nodes(monkeypatch, 2)
    monkeypatch.setenv("CCL_LINK_GBPS", "0.1")
    mine = comm.Dup()
    try:
        c = ccl.Communicator(mine, codec="3lc")
        y = c.allreduce(rank_input(comm.rank, 1 << 17), key="g")
        assert_same_on_all_ranks(comm, y)
        assert c.stats()["algorithms"] == {"hierarchical": 1}
        # the bytes sent inside the node and across are the call's: at least this rank's
        # share of the node's uncompressed reduce-scatter (half of 512 KB, nodes of two)
        assert c.stats()["bytes_sent"] >= (1 << 17) * 4 // 2
    finally:
        mine.Free()


@pytest.mark.mpi(min_size=2)
def test_a_failure_on_one_node_raises_on_every_rank(comm, monkeypatch):
    _nodes(monkeypatch, _cross_nodes(comm.size))  # one node compresses nothing
    mine = comm.Dup()
    try:
        codec = ccl.codecs.get_codec("3lc")
        original = type(codec)._encode

        def encode(this, x, ctx):
            if MPI.COMM_WORLD.rank == comm.size - 1:
                raise MemoryError("injected")
            return original(this, x, ctx)

        monkeypatch.setattr(type(codec), "_encode", encode)
        failing = comm.rank == comm.size - 1
        with pytest.raises(MemoryError if failing else ccl.PeerError):
            ccl.compressed_allreduce(rank_input(comm.rank, 5000), codec, comm=mine,
                                     algorithm="hierarchical")
    finally:
        mine.Free()


def _cross_nodes(p):
    """Ranks per node for a layout with traffic across nodes: 2 where it divides p, else 1."""
    return 2 if p % 2 == 0 and p > 2 else 1


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("codec", registered_codecs())
def test_keyed_calls_of_every_codec_run_on_across_nodes(comm, monkeypatch, codec):
    """The 2nd keyed call used to stop THC (the shared statistics read the slices' residuals)."""
    p = comm.size
    _nodes(monkeypatch, _cross_nodes(p))
    mine = comm.Dup()
    try:
        c = ccl.Communicator(mine, codec=codec, algorithm="hierarchical", min_compress_bytes=0)
        n, delivered, put_in = 10_000, np.zeros(10_000), np.zeros(10_000)
        for step in range(4):
            y = c.allreduce(rank_input(comm.rank, n, step=step), key="w")
            assert_same_on_all_ranks(comm, y)
            delivered += y
            put_in += exact_sum(p, n, step=step)
        if get_codec(codec).error_feedback:  # nothing lost: delivered + held = put in
            held = comm.allreduce(c.feedback.get("w").held(n), op=MPI.SUM)
            scale = max(1.0, float(np.abs(put_in).max()))
            np.testing.assert_allclose(delivered + held, put_in, atol=2e-2 * scale)
    finally:
        mine.Free()


@pytest.mark.mpi
@pytest.mark.parametrize("codec", ["3lc", "thc", "topk", "onebit"])
def test_one_node_is_exact(comm, monkeypatch, codec):
    """With one node there is no link across nodes: nothing is compressed."""
    _nodes(monkeypatch, comm.size)
    mine = comm.Dup()
    try:
        for key in (None, "k", "k"):
            x = rank_input(comm.rank, 5000)
            y = ccl.compressed_allreduce(x, codec, comm=mine, algorithm="hierarchical",
                                         key=key)
            assert_same_on_all_ranks(comm, y)
            np.testing.assert_allclose(y, exact_sum(comm.size, 5000), rtol=1e-5,
                                       atol=1e-5 * comm.size)
    finally:
        mine.Free()
