"""GPU tests: device kernels under numba's CUDA simulator, and the public API over array modules.

``python -m pytest tests_gpu`` turns the simulator on (``NUMBA_ENABLE_CUDASIM=1``, which
must happen before numba is imported, hence here) unless ``CCL_TEST_GPU=1`` asks for a
real GPU. The ``xp`` fixture runs a test with numpy arrays, with numpy arrays taken
down the device code paths (``simulated``), and with cupy arrays. Without a GPU the
cupy cases skip with a reason; with ``CCL_TEST_GPU=1`` they fail instead, so a
misconfigured GPU runner cannot pass by skipping.
"""

import os
import sys

if os.environ.get("CCL_TEST_GPU") != "1":
    if "numba" in sys.modules and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        raise RuntimeError("numba was imported before tests_gpu/conftest.py could turn the CUDA "
                           "simulator on; run: NUMBA_ENABLE_CUDASIM=1 python -m pytest tests_gpu")
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))



def pytest_configure(config):
    # The simulator runs kernels as Python on numpy scalars: the wrapping integer
    # arithmetic of the random streams and bit tricks warns there (compiled kernels wrap
    # silently, as the C types do).
    config.addinivalue_line("filterwarnings", "ignore:overflow encountered:RuntimeWarning")


SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def gpu_unavailable_reason():
    """Why cupy arrays cannot be tested here, or None when a GPU and cupy are usable."""
    if SIMULATOR:
        return "numba's CUDA simulator is on; cupy cases need a GPU (CCL_TEST_GPU=1)"
    try:
        import cupy
    except ImportError:
        return "cupy is not installed (pip install '.[gpu]')"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # cupy raises its own CUDARuntimeError without a driver
        return f"no usable GPU ({exc})"
    return None if count else "no GPU"


def skip_or_fail_gpu(reason):
    """Skip a GPU case, or fail it when ``CCL_TEST_GPU=1`` says a GPU is required."""
    if os.environ.get("CCL_TEST_GPU") == "1":
        pytest.fail(f"CCL_TEST_GPU=1 but {reason}")
    pytest.skip(reason)


class ArrayModule:
    """How a test makes its inputs: ``asarray`` in and ``to_numpy`` out."""

    def __init__(self, name, xp, simulated=False):
        self.name, self.xp, self.simulated = name, xp, simulated

    def asarray(self, a):
        return self.xp.asarray(a)

    def to_numpy(self, a):
        return a.get() if self.name == "cupy" else np.asarray(a)

    def context(self):
        from ccl._xp import simulated_device
        import contextlib

        return simulated_device() if self.simulated else contextlib.nullcontext()

    def __repr__(self):
        return self.name


@pytest.fixture(params=["numpy", "simulated", "cupy"])
def xp(request):
    """The array module of a public-API test: numpy, numpy down the device paths, cupy."""
    if request.param == "numpy":
        return ArrayModule("numpy", np)
    if request.param == "simulated":
        return ArrayModule("simulated", np, simulated=True)
    reason = gpu_unavailable_reason()
    if reason:
        skip_or_fail_gpu(reason)
    import cupy

    return ArrayModule("cupy", cupy)


@pytest.fixture
def comm():
    """A fresh duplicate of COMM_WORLD for one test."""
    c = MPI.COMM_WORLD.Dup()
    yield c
    c.Free()
