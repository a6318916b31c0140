"""GPU transport logic that runs without a GPU: the pinned-buffer pool, staging, detection.

The pool and the stager take their allocator and copies from a backend; here
that is :data:`ccl._xp.SIMULATED` (numpy arrays standing in for device arrays),
so staged payloads really cross the MPI library through separate host buffers.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI

import ccl
from ccl._xp import SIMULATED, simulated_device
from ccl.transport import channel
from ccl.transport.staging import PinnedPool, Route, Stager, detect_cuda_aware, size_class

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CountingAlloc:
    def __init__(self):
        self.sizes = []

    def __call__(self, nbytes):
        self.sizes.append(nbytes)
        return np.empty(nbytes, dtype=np.uint8)


def test_size_classes():
    assert [size_class(n) for n in (0, 1, 4096, 4097, 10000, 1 << 20)] == \
        [4096, 4096, 4096, 8192, 16384, 1 << 20]


def test_pool_reuses_and_grows():
    alloc = CountingAlloc()
    pool = PinnedPool(alloc)
    a = pool.acquire(100)
    b = pool.acquire(5000)
    assert (a.size, b.size) == (4096, 8192) and pool.allocations == 2
    pool.release(a)
    pool.release(b)
    assert pool.acquire(3000) is a  # same class: reused, not allocated
    c = pool.acquire(4000)  # a is taken: a second 4 KiB buffer
    assert c is not a and pool.allocations == 3
    big = pool.acquire(1 << 20)  # growth: a larger class
    assert big.size == 1 << 20 and alloc.sizes == [4096, 8192, 4096, 1 << 20]
    for buf in (a, c, big):
        pool.release(buf)
    assert pool.held_bytes() == 4096 * 2 + 8192 + (1 << 20)


def test_stager_copies_only_when_not_aware():
    pool = PinnedPool(CountingAlloc())
    payload = np.arange(10, dtype=np.uint8)
    staged = Stager(SIMULATED, aware=False, pool=pool)
    wire = staged.send_buffer(payload)
    assert wire is not payload and not np.shares_memory(wire, payload)
    assert np.array_equal(wire, payload)
    landing = staged.recv_buffer(7)
    landing[:] = 9
    out = staged.finish(landing)
    assert not np.shares_memory(out, landing) and np.array_equal(out, np.full(7, 9, np.uint8))
    staged.release_all()
    assert pool.allocations == 2 and pool.held_bytes() == 8192
    direct = Stager(SIMULATED, aware=True, pool=pool)
    assert direct.send_buffer(payload) is payload
    assert direct.finish(direct.recv_buffer(3)).size == 3


def test_detection_order():
    none = lambda: None  # noqa: E731
    no_kinds = lambda: ""  # noqa: E731
    assert detect_cuda_aware({"CCL_CUDA_AWARE": "1"}, query=lambda: False) is True
    assert detect_cuda_aware({"CCL_CUDA_AWARE": "0"}, memory_kinds=lambda: "cuda") is False
    with pytest.raises(ValueError, match="CCL_CUDA_AWARE"):
        detect_cuda_aware({"CCL_CUDA_AWARE": "maybe"})
    assert detect_cuda_aware({}, query=none, memory_kinds=lambda: "mpi,system,cuda:device")
    assert detect_cuda_aware({}, query=lambda: True, memory_kinds=no_kinds) is True
    assert detect_cuda_aware({"MV2_USE_CUDA": "1"}, query=lambda: False,
                             memory_kinds=no_kinds) is False  # the library's answer wins
    assert detect_cuda_aware({"MPICH_GPU_SUPPORT_ENABLED": "1"}, query=none,
                             memory_kinds=no_kinds) is True
    assert detect_cuda_aware({}, query=none, memory_kinds=no_kinds) is False  # the safe default


def test_this_mpi_is_not_cuda_aware_by_default():
    """The mpich wheel has no GPU support: detection must not claim it."""
    env = {k: v for k, v in os.environ.items() if k != "CCL_CUDA_AWARE"}
    assert detect_cuda_aware(env) is False


def test_cpu_only_run_never_imports_cupy():
    code = ("import sys, numpy as np, ccl\n"
            "y = ccl.compressed_allreduce(np.ones(1000, np.float32), '3lc', algorithm='ring')\n"
            "ccl.codecs.get_codec('thc').encode(np.ones(100, np.float32))\n"
            "print('cupy' in sys.modules, 'numba.cuda' in sys.modules)\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMI_FD", "PMI_PORT",
                 "PMIX_RANK", "HYDI_CONTROL_FD"):
        env.pop(name, None)  # a singleton, even when this test runs under mpiexec
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.mpi
@pytest.mark.parametrize("aware", [False, True])
def test_staged_payloads_land_intact(comm, aware):
    """Device payloads (numpy stand-ins) through the channel, staged or handed over directly."""
    ch = channel(comm)
    pool_before = None
    for call in range(3):
        with ch.collective("staging test", None):
            ch.use_backend(SIMULATED, aware=aware)
            p, r = ch.size, ch.rank
            mine = np.full(100 + 37 * r + call, r + 1, dtype=np.uint8)
            got = ch.sendrecv(mine, (r + 1) % p, (r - 1) % p, 7)
            left = (r - 1) % p
            assert np.array_equal(got, np.full(100 + 37 * left + call, left + 1, np.uint8))
            parts = ch.allgather(mine)
            for i, part in enumerate(parts):
                assert np.array_equal(part, np.full(100 + 37 * i + call, i + 1, np.uint8))
            root = ch.bcast(mine, root=p - 1)
            assert np.array_equal(root, np.full(100 + 37 * (p - 1) + call, p, np.uint8))
            total = ch.allreduce_sum(np.full(5, r, np.float32))
            assert np.array_equal(total, np.full(5, p * (p - 1) / 2, np.float32))
        assert ch.route.current is None  # the collective ended: back to host memory
        stager = ch.route.stager("simulated", aware)
        if aware:
            assert stager.pool.allocations == 0
        elif pool_before is None:
            pool_before = stager.pool.allocations
        else:  # later calls reuse the pinned buffers of the first
            assert stager.pool.allocations == pool_before


@pytest.mark.mpi
def test_every_step_of_hierarchical_routes_device_arrays(comm, monkeypatch):
    """The node's reduce-scatter and its allgather both take the device route.

    Each step of ``hierarchical`` is a collective of its own on the node's
    channel, which goes back to host memory when a collective ends: the
    allgather once ran on the host route with device arrays, handing MPI
    device memory it cannot read (without CUDA-aware MPI).
    """
    # one node of every rank: nothing is compressed, so no device kernel runs here
    monkeypatch.setenv("CCL_LOCAL_SIZE", str(MPI.COMM_WORLD.size))
    routes = []
    uncompressed = Route.uncompressed

    def recording(route, x, run):
        routes.append(route.current is not None)
        return uncompressed(route, x, run)

    monkeypatch.setattr(Route, "uncompressed", recording)
    x = np.arange(40, dtype=np.float32) + comm.rank
    with simulated_device():
        y = ccl.compressed_allreduce(x, "fp16", comm=comm, algorithm="hierarchical")
    assert routes == [True, True]  # the reduce-scatter, then the allgather
    p = comm.size
    np.testing.assert_array_equal(y, p * np.arange(40, dtype=np.float32) + p * (p - 1) / 2)
