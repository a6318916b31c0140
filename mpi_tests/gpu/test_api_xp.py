"""The public API over array modules: numpy, numpy down the device paths, cupy.

Results keep the input's array module, shape and dtype, and equal the numpy
path's results bitwise (the payloads are the same bytes). Runs at one rank in
the serial run and at every rank count under mpiexec (``--only-mpi``).
"""

import numpy as np
import pytest

import ccl

# each codec with the algorithms that fit it, and every algorithm several times
PAIRS = [("none", "tree"), ("fp16", "ring"), ("bf16", "direct"),
         ({"id": "3lc", "s": 1.5}, "direct"), ({"id": "3lc", "s": 1.5}, "ring"),
         ({"id": "thc", "block": 16}, "ring"), ({"id": "thc", "block": 16}, "tree"),
         ("onebit", "allgather"), ("onebit", "direct"),
         ({"id": "randomk", "density": 0.25}, "ring"),
         ({"id": "randomk", "density": 0.25}, "tree"),
         ({"id": "dithering", "levels": 7}, "direct"),
         ({"id": "topk", "density": 0.1}, "allgather"),
         ({"id": "dgc", "density": 0.1}, "allgather"), ({"id": "dgc", "density": 0.1}, "ring")]


def _input(rank, n=103, shape=None):
    x = np.random.default_rng([rank, n]).standard_normal(n).astype(np.float32)
    return x if shape is None else x.reshape(shape)


def _id(spec):
    return spec if isinstance(spec, str) else spec["id"]


def _run(xp, fn):
    with xp.context():
        return fn()


@pytest.mark.mpi
@pytest.mark.parametrize("codec,algorithm", PAIRS, ids=[f"{_id(c)}-{a}" for c, a in PAIRS])
def test_allreduce_keeps_module_and_matches_numpy(xp, comm, codec, algorithm):
    x = _input(comm.rank, shape=(103,))
    # two communicators: the same key and step (seeds), separate error-feedback state
    dev, host = (ccl.Communicator(comm, codec, algorithm=algorithm, min_compress_bytes=0)
                 for _ in range(2))
    y = _run(xp, lambda: dev.allreduce(xp.asarray(x), key="w"))
    assert isinstance(y, xp.xp.ndarray)
    assert y.shape == x.shape and y.dtype == x.dtype
    np.testing.assert_array_equal(xp.to_numpy(y), host.allreduce(x, key="w"))


@pytest.mark.mpi
@pytest.mark.parametrize("codec", ["fp16", {"id": "3lc", "s": 1.5}], ids=_id)
def test_reduce_scatter_allgather_and_communicator(xp, comm, codec):
    x = _input(comm.rank, n=50).reshape(5, 10)
    blk = _run(xp, lambda: ccl.reduce_scatter(xp.asarray(x), codec, comm=comm, algorithm="direct"))
    assert isinstance(blk, xp.xp.ndarray)
    np.testing.assert_array_equal(
        xp.to_numpy(blk), ccl.reduce_scatter(x, codec, comm=comm, algorithm="direct"))
    block = _input(comm.rank, n=comm.rank + 3)
    full = _run(xp, lambda: ccl.allgather(xp.asarray(block), codec, comm=comm))
    assert isinstance(full, xp.xp.ndarray)
    np.testing.assert_array_equal(xp.to_numpy(full), ccl.allgather(block, codec, comm=comm))
    c = ccl.Communicator(comm, codec=codec, algorithm="ring", min_compress_bytes=0)
    h = ccl.Communicator(comm, codec=codec, algorithm="ring", min_compress_bytes=0)
    for step in range(3):  # error feedback state on the device, step after step
        xs = _input(comm.rank + 10 * step, n=64)
        y = _run(xp, lambda xs=xs: c.allreduce(xp.asarray(xs), key="k", op="mean"))
        assert isinstance(y, xp.xp.ndarray)
        np.testing.assert_array_equal(xp.to_numpy(y), h.allreduce(xs, key="k", op="mean"))


@pytest.mark.mpi
def test_auto_mpi_allreduce_and_float64(xp, comm):
    x = _input(comm.rank, n=40).astype(np.float64)
    y = _run(xp, lambda: ccl.compressed_allreduce(xp.asarray(x), "none", comm=comm))
    assert isinstance(y, xp.xp.ndarray) and y.dtype == np.float64
    expected = np.empty_like(x)
    comm.Allreduce(x, expected)
    np.testing.assert_array_equal(xp.to_numpy(y), expected)


@pytest.mark.mpi
def test_nonfinite_chunk_is_nan_everywhere(xp, comm):
    x = _input(comm.rank, n=30)
    if comm.rank == 0:
        x[3] = np.inf
    y = _run(xp, lambda: ccl.compressed_allreduce(xp.asarray(x), "onebit", comm=comm,
                                                  algorithm="allgather"))
    assert np.isnan(xp.to_numpy(y)).all()
    with pytest.raises(ccl.NonFiniteError):
        _run(xp, lambda: ccl.compressed_allreduce(xp.asarray(x), "onebit", comm=comm,
                                                  algorithm="allgather", check_finite=True))


def test_torch_tensors_through_dlpack():
    """CPU tensors stay numpy; CUDA tensors go through DLPack (GPU only)."""
    torch = pytest.importorskip("torch")
    from ccl.torch.functions import from_array, to_array

    t = torch.arange(6, dtype=torch.float32)
    a = to_array(t)
    assert isinstance(a, np.ndarray) and np.shares_memory(a, t.numpy())
    assert torch.equal(from_array(a * 2, like=t), t * 2)
    if torch.cuda.is_available():  # pragma: no cover - needs a GPU
        g = t.cuda()
        arr = to_array(g)
        assert type(arr).__module__.startswith("cupy")
        assert from_array(arr, like=g).is_cuda


def test_codec_encode_keeps_module(xp):
    codec = ccl.codecs.get_codec("3lc")
    x = _input(0, n=33)
    payload = _run(xp, lambda: codec.encode(xp.asarray(x)))
    assert isinstance(payload, xp.xp.ndarray)
    np.testing.assert_array_equal(xp.to_numpy(payload), codec.encode(x))
    back = _run(xp, lambda: codec.decode(payload))
    assert isinstance(back, xp.xp.ndarray)


