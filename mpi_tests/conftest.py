"""Fixtures shared by the suite.

MPI tests run under ``mpiexec -n N python -m mpi4py -m pytest --with-mpi -x``:
the first failure aborts the whole job, pytest-timeout's thread method kills
a stuck rank, and every test gets its own duplicated communicator so a
collective left dangling by one test can never match the next test's.
"""

import os
import shutil
import subprocess
import sys
import zlib

import numpy as np
import pytest
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(__file__))

from ccl.codecs import Codec, register_codec  # noqa: E402


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mpiexec():
    """The ``mpiexec`` next to this Python, else on PATH (None if there is none)."""
    candidate = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return candidate if os.path.exists(candidate) else shutil.which("mpiexec")


def launch(args, ranks, timeout):
    """Run ``mpiexec -n ranks python *args`` as a job of its own, from the repository root.

    Skips the test where there is no ``mpiexec``. Returns the
    ``subprocess.CompletedProcess`` (text output captured).
    """
    if mpiexec() is None:
        pytest.skip("no mpiexec on PATH")
    env = dict(os.environ, HYDRA_LAUNCHER="fork", MPIEXEC_TIMEOUT=str(timeout),
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    # the launcher variables of an enclosing job would describe that job, not this one
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"):
        env.pop(name, None)
    return subprocess.run([mpiexec(), "-n", str(ranks), sys.executable, *args],
                          capture_output=True, text=True, timeout=timeout + 30, env=env,
                          cwd=ROOT)


def _free_port():
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def process_group():
    """A gloo process group over the world's ranks (DDP's, FSDP's), one per test module."""
    dist = pytest.importorskip("torch.distributed")
    world = MPI.COMM_WORLD
    port = world.bcast(_free_port() if world.rank == 0 else None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=world.rank,
                            world_size=world.size)
    yield
    dist.destroy_process_group()


@pytest.fixture
def comm():
    """A fresh duplicate of COMM_WORLD for one test."""
    c = MPI.COMM_WORLD.Dup()
    yield c
    c.Free()


@pytest.fixture
def hvd(comm):
    """``ccl.torch`` initialised on the test's own communicator, shut down after the test."""
    ct = pytest.importorskip("ccl.torch")
    ct.init(comm)
    yield ct
    ct.shutdown()


def rank_input(rank, n, seed=0, dtype=np.float32, step=0):
    """Rank ``rank``'s input: every rank can rebuild every other rank's input locally."""
    rng = np.random.default_rng([seed, step, rank, n])
    return rng.standard_normal(n).astype(dtype)


def exact_sum(size, n, seed=0, dtype=np.float32, step=0):
    """The float64 sum of every rank's :func:`rank_input`."""
    total = np.zeros(n, dtype=np.float64)
    for r in range(size):
        total += rank_input(r, n, seed, dtype, step)
    return total


def assert_same_on_all_ranks(comm, array):
    """Fail unless ``array`` is bitwise identical on every rank (NaN patterns included)."""
    digest = zlib.crc32(np.ascontiguousarray(array).view(np.uint8).tobytes())
    digests = comm.allgather((digest, array.shape, str(array.dtype)))
    assert all(d == digests[0] for d in digests), f"results differ across ranks: {digests}"


@register_codec
class StepQuantCodec(Codec):
    """Test-only lossy codec: rounds to multiples of max|x|/levels (deterministic, biased).

    Small and exact enough to check the error-feedback machinery of every
    algorithm before (and independently of) the real codecs.
    """

    codec_id = "test-stepquant"
    wire_id = 250
    bits_per_value = 8.0  # an int8 per value (the scale is negligible)

    def __init__(self, levels=3):
        self.levels = int(levels)

    def _encode(self, x, ctx):
        scale = float(np.abs(x).max()) / self.levels if x.size else 0.0
        q = np.zeros(x.size, np.int8) if scale == 0 else np.rint(x / scale).astype(np.int8)
        return np.concatenate([np.frombuffer(np.float64(scale).tobytes(), np.uint8),
                               q.view(np.uint8)]), 0

    def _decode(self, header, body, ctx):
        from ccl.errors import PayloadError
        if body.size != 8 + header.n:
            raise PayloadError("bad body")
        scale = body[:8].view(np.float64)[0]
        return (body[8:].view(np.int8).astype(np.float64) * scale).astype(np.float32)
