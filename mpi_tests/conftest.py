"""Fixtures and markers shared by the suite.

MPI tests run under ``mpiexec -n N python -m mpi4py -m pytest --with-mpi -x``:
the first failure aborts the whole job, pytest-timeout's thread method kills
a stuck rank, and every test gets its own duplicated communicator so a
collective left dangling by one test can never match the next test's.

Markers (registered in ``pytest.ini``): ``mpi`` (pytest-mpi; ``mpi(min_size=2)``
skips below two ranks), ``serial`` (a test that runs once, in the serial
pass, e.g. because it launches MPI jobs of its own) and ``max_ranks(n)``
(skipped above ``n`` ranks). ``max_ranks(3)`` marks training and benchmark
runs and the torch layer above the collectives (optimizers, hooks, FSDP,
Horovod's optimizer API): what they add to the collectives does not hinge on
the rank count beyond one, two (even) and three (odd, uneven shards) ranks,
while the collectives under them are tested at 1-5 ranks on their own. With
more ranks than cores, their many short exchanges and threads only make the
MPI phases slow and erratic (a 4-rank phase took 5.5 to 16 minutes).
``mpi_tests/gpu/`` is collected only when named on the command line (``make
test-gpu-sim``): its conftest turns numba's CUDA simulator on, which must not
happen to the rest.

This module imports ``ccl`` only inside hooks and fixtures, for the same
reason: the GPU conftest must set the simulator before numba is imported.
"""

import pathlib

import pytest
from mpi4py import MPI

GPU_TESTS = pathlib.Path(__file__).resolve().parent / "gpu"


def _names_gpu_tests(config):
    """Whether the command line names ``mpi_tests/gpu`` or something in it."""
    for arg in config.args:
        path = pathlib.Path(config.invocation_params.dir, arg.split("::")[0]).resolve()
        if path == GPU_TESTS or GPU_TESTS in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    # the GPU tests run in a process of their own, under the simulator or on a GPU
    if collection_path == GPU_TESTS and not _names_gpu_tests(config):
        return True
    return None


def pytest_configure(config):
    from mpi_tests.helpers import stepquant  # noqa: F401  (registers "test-stepquant")


def pytest_runtest_setup(item):
    if item.get_closest_marker("serial") is not None and MPI.COMM_WORLD.size > 1:
        pytest.skip("serial test: runs once, in the serial pass")
    most = item.get_closest_marker("max_ranks")
    if most is not None and MPI.COMM_WORLD.size > most.args[0]:
        # its cost grows with the ranks (on shared CI cores) while what it checks does not
        pytest.skip(f"above the collectives: at most {most.args[0]} ranks")


@pytest.fixture(scope="module")
def process_group():
    """A gloo process group over the world's ranks (DDP's, FSDP's), one per test module.

    The benchmarks' group (:func:`ccl.bench.gloo.gloo_group`): the garbage the
    module's tests left is collected before the group is destroyed.
    """
    pytest.importorskip("torch.distributed")
    from ccl.bench.gloo import gloo_group

    with gloo_group(MPI.COMM_WORLD):
        yield


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
