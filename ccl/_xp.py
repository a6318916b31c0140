"""Array-module dispatch: numpy on the host, cupy on the device, chosen from the input.

ccl never imports cupy by itself. :func:`backend_of` looks at the type of the
array it is given: only an object whose class comes from a ``cupy`` module
(which means the user already imported cupy) selects the cupy backend, so a
CPU-only install never loads it.

A :class:`Backend` bundles what the rest of ccl needs from an array library:
the array namespace ``xp`` (``numpy`` or ``cupy``), whether arrays live on a
device (kernels are then numba.cuda kernels and payloads go to MPI through
:mod:`ccl.transport.staging`), and the few copies between host and device. Everything
device-specific beyond that lives in :class:`_CupyBackend`, kept thin because
it only runs where a GPU is present.

Tests run the device code paths on the host with :func:`simulated_device`: a
backend whose arrays are numpy arrays but which takes every device branch
(numba.cuda kernels under ``NUMBA_ENABLE_CUDASIM=1``, host staging in the
transport).
"""

import contextlib
import math
import sys
from typing import TypeVar

import numpy as np

#: An array of either module: numpy, or cupy where the work runs on the device. Annotations
#: use it where a function returns the kind of array it was given.
ArrayT = TypeVar("ArrayT")

__all__ = ["Backend", "HOST", "array_module", "backend_of", "is_device_array", "host_norm",
           "simulated_device", "to_numpy"]


class Backend:
    """The host backend (numpy); base class of the device backends.

    Attributes
    ----------
    name : str
        ``"numpy"``, ``"cupy"`` or ``"simulated"``.
    xp : module
        The array namespace (``numpy`` or ``cupy``).
    device : bool
        Arrays live on a GPU (or a simulated one): kernels are numba.cuda
        kernels and payloads are device arrays.
    """

    name = "numpy"
    device = False

    @property
    def xp(self):
        return np

    def owns(self, x):
        """Whether ``x`` is an array of this backend."""
        return isinstance(x, np.ndarray)

    def to_host(self, a):
        """A numpy copy (or view, on the host) of the array ``a``."""
        return np.asarray(a)

    def to_device(self, host):
        """An array of this backend holding the numpy array ``host``."""
        return np.array(host, copy=True)

    def upload(self, dst, host):
        """Copy the numpy array ``host`` into the (contiguous) array ``dst``."""
        dst[...] = host

    def download(self, src, host):
        """Copy the array ``src`` into the numpy array ``host`` (same size)."""
        host[...] = src

    def synchronize(self):
        """Wait until the device finished the work queued so far (host: nothing to wait for)."""

    def all_finite(self, x):
        """Whether the float array ``x`` holds no NaN or Inf."""
        return bool(self.xp.isfinite(x).all())

    def stream(self):
        """The stream numba.cuda kernels launch on (0: the default stream)."""
        return 0

    def pinned_empty(self, nbytes):
        """A host uint8 buffer for staging (page-locked on a GPU)."""
        return np.empty(nbytes, dtype=np.uint8)

    def __repr__(self):
        return f"<ccl backend {self.name}>"


class _SimulatedBackend(Backend):
    """numpy arrays treated as device arrays: every device branch, no GPU needed."""

    name = "simulated"
    device = True

    def to_host(self, a):
        return np.array(a, copy=True)  # a real device-to-host copy never aliases


class _CupyBackend(Backend):
    """cupy arrays; numba.cuda kernels launch on cupy's current stream."""

    name = "cupy"
    device = True

    def __init__(self, cupy):
        self._cupy = cupy
        self._streams = {}
        self._all_finite = None

    @property
    def xp(self):
        return self._cupy

    def owns(self, x):
        return isinstance(x, self._cupy.ndarray)

    def to_host(self, a):
        return self._cupy.asnumpy(a)

    def to_device(self, host):
        return self._cupy.asarray(host)

    def upload(self, dst, host):
        dst.set(np.ascontiguousarray(host).reshape(dst.shape))

    def download(self, src, host):
        src.get(out=host)

    def synchronize(self):
        self._cupy.cuda.get_current_stream().synchronize()

    def all_finite(self, x):
        # one fused pass: isfinite(x).all() would first write a boolean array as large as x
        # (measured on an H100: 0.5 ms of a 256 MB encode's 2 ms); in double, exact for
        # float16, float32 and float64 alike
        if self._all_finite is None:
            self._all_finite = self._cupy.ReductionKernel(
                "T x", "bool y", "isfinite((double)x)", "a && b", "y = a", "true",
                "ccl_all_finite")
        return bool(self._all_finite(x))

    def stream(self):
        from numba import cuda  # only on a GPU: the external-stream wrapper needs a driver

        ptr = self._cupy.cuda.get_current_stream().ptr
        if ptr not in self._streams:
            self._streams[ptr] = cuda.external_stream(ptr) if ptr else cuda.default_stream()
        return self._streams[ptr]

    def pinned_empty(self, nbytes):
        import cupyx

        return cupyx.empty_pinned((nbytes,), dtype=np.uint8)


HOST = Backend()
SIMULATED = _SimulatedBackend()
_CUPY = None
_FORCED = None  # set by simulated_device(): numpy input takes the device paths


def _cupy_backend():
    global _CUPY
    if _CUPY is None:
        _CUPY = _CupyBackend(sys.modules["cupy"])
    return _CUPY


def host_norm(x):
    """``||x||_2`` of a host array, in float64, without BLAS.

    numpy's ``linalg.norm`` of a vector is a BLAS dot product, and OpenBLAS
    wakes its worker threads for a long one; they spin for a while after
    it, and on a machine whose cores all run ranks they took time slices
    from the calls that followed: 1 MB allreduces on 2 emulated hosts
    stalled in steps of about 4 ms (docs/benchmarks.md, "What stalled the
    calls").

    >>> host_norm(np.array([3.0, 4.0]))
    5.0
    """
    return math.sqrt(float(np.square(np.asarray(x), dtype=np.float64).sum()))


def is_device_array(x):
    """Whether ``x`` is a cupy array (without importing cupy)."""
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(x, cupy.ndarray)


def backend_of(x):
    """The :class:`Backend` of array ``x``: cupy for cupy arrays, else numpy.

    Inside :func:`simulated_device`, numpy arrays get the simulated device
    backend instead.
    """
    if type(x).__module__.split(".", 1)[0] == "cupy" and is_device_array(x):
        return _cupy_backend()
    if _FORCED is not None and isinstance(x, np.ndarray):
        return _FORCED
    return HOST


def array_module(x):
    """The array namespace of ``x``: ``cupy`` for cupy arrays, else ``numpy``."""
    return backend_of(x).xp


def to_numpy(x):
    """A numpy array of ``x``'s values (copied off the device when needed)."""
    return backend_of(x).to_host(x) if is_device_array(x) else np.asarray(x)


@contextlib.contextmanager
def simulated_device():
    """Treat numpy arrays as device arrays inside the block (for tests).

    Combined with ``NUMBA_ENABLE_CUDASIM=1`` this runs the GPU code paths of
    the codecs, collectives and transport on a machine without a GPU.
    """
    global _FORCED
    previous, _FORCED = _FORCED, SIMULATED
    try:
        yield SIMULATED
    finally:
        _FORCED = previous
