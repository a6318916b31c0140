"""The GPU tests' array modules and their rule: skip without a GPU, fail if one is required."""

import contextlib
import os

import numpy as np
import pytest

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

        return simulated_device() if self.simulated else contextlib.nullcontext()

    def __repr__(self):
        return self.name
