"""GPU tests: device kernels under numba's CUDA simulator, and the public API over array modules.

``python -m pytest mpi_tests/gpu`` turns the simulator on (``NUMBA_ENABLE_CUDASIM=1``, which
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
        raise RuntimeError("numba was imported before mpi_tests/gpu/conftest.py could turn the "
                           "CUDA simulator on; run: NUMBA_ENABLE_CUDASIM=1 python -m pytest "
                           "mpi_tests/gpu")
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mpi_tests.helpers.gpu import (  # noqa: E402
    ArrayModule, gpu_unavailable_reason, skip_or_fail_gpu)


def pytest_configure(config):
    # The simulator runs kernels as Python on numpy scalars: the wrapping integer
    # arithmetic of the random streams and bit tricks warns there (compiled kernels wrap
    # silently, as the C types do).
    config.addinivalue_line("filterwarnings", "ignore:overflow encountered:RuntimeWarning")


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

