"""Helpers shared by the onebit, randomk and dithering kernels.

Counter-based random numbers, float32 scale rounding, and
:func:`sized_kernel`, which runs small inputs on one thread.

A counter-based generator is a pure function of ``(seed, counter)``: there is
no state to carry from one call to the next, so a rank that skips a step (or
decodes a payload from another step) cannot drift out of step with its peers,
and a kernel can draw the numbers of any element independently, in parallel.
ccl uses SplitMix64's finaliser (Steele, Lea, Flood 2014) over
``seed + (counter + 1) * golden``, which is the SplitMix64 stream itself.
"""

import numba
import numpy as np

from .._jit import njit


@njit
def masked_max(bits, mask):
    """Largest ``bits[i] & mask`` of an unsigned integer array.

    An integer max vectorises where a float reduction would not. Index from 0
    over a slice: with an arbitrary start, numba's negative-index wraparound
    keeps LLVM from vectorising the loop (about 7x slower).
    """
    top = bits.dtype.type(0)
    for i in range(bits.size):
        top = max(top, bits[i] & mask)
    return top

__all__ = ["mix64", "stream64", "mulhi64", "uniform_below", "f32_round_up", "sized_kernel",
           "PARALLEL_MIN_SIZE"]

# Below this many elements a kernel runs serially: waking numba's thread pool costs
# microseconds on an idle node and up to milliseconds on a busy one, more than the work.
PARALLEL_MIN_SIZE = 1 << 17

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MASK32 = np.uint64(0xFFFFFFFF)
_F32_MAX = float(np.finfo(np.float32).max)


@njit
def mix64(z):
    """SplitMix64's finaliser: a bijective 64-bit mixer with full avalanche."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@njit
def stream64(seed, counter):
    """The ``counter``-th 64-bit output of the SplitMix64 stream started at ``seed``."""
    return mix64(np.uint64(seed) + (np.uint64(counter) + np.uint64(1)) * _GOLDEN)


@njit
def mulhi64(a, b):
    """High 64 bits of the 128-bit product ``a * b`` (uint64), from 32-bit halves.

    numba has no 128-bit integer type.
    """
    a_lo, a_hi = a & _MASK32, a >> np.uint64(32)
    b_lo, b_hi = b & _MASK32, b >> np.uint64(32)
    lo_lo = a_lo * b_lo
    hi_lo = a_hi * b_lo
    lo_hi = a_lo * b_hi
    cross = (lo_lo >> np.uint64(32)) + (hi_lo & _MASK32) + lo_hi
    return a_hi * b_hi + (hi_lo >> np.uint64(32)) + (cross >> np.uint64(32))


@njit
def uniform_below(seed, counter, bound):
    """Exactly uniform integer in ``[0, bound)`` (``bound >= 1``) from the stream at ``counter``.

    Lemire's multiply-and-reject method. Rejections draw from counters far
    above any caller's own range (counter + k * 2^62), so the result remains
    a pure function of ``(seed, counter, bound)``.

    Returns
    -------
    int
        The draw, as uint64.
    """
    s = np.uint64(bound)
    r = stream64(seed, counter)
    lo = r * s
    if lo < s:
        threshold = (np.uint64(0) - s) % s
        attempt = np.uint64(1)
        while lo < threshold:
            r = stream64(seed, np.uint64(counter) + attempt * np.uint64(1 << 62))
            lo = r * s
            attempt += np.uint64(1)
    return mulhi64(r, s)


def f32_round_up(value):
    """The smallest float32 ``>= value`` (a float >= 0), or None if above the float32 range.

    Scales sent as float32 are rounded up so that ``|x| / scale <= 1`` still
    holds for the exact (float64) statistic.
    """
    if value > _F32_MAX:
        return None
    f = np.float32(value)
    if float(f) < value:
        f = np.nextafter(f, np.float32(np.inf))
    if not np.isfinite(f):
        return None
    return float(f)


class _SizedKernel:
    """A kernel compiled twice, parallel and serial, chosen per call.

    The parallel variant runs for work of at least :data:`PARALLEL_MIN_SIZE`
    when the calling thread may use more than one numba thread (the thread
    budget, :mod:`ccl.threads`).
    """

    def __init__(self, func, size_arg):
        self.py_func = func
        self.parallel = njit(parallel=True)(func)
        self.serial = njit(func)
        self._size_arg = size_arg

    def __call__(self, *args):
        size = args[self._size_arg]
        size = size.size if isinstance(size, np.ndarray) else int(size)
        # threads cannot pay below the size, nor with a budget of one (ccl.threads)
        parallel = size >= PARALLEL_MIN_SIZE and numba.get_num_threads() > 1
        kernel = self.parallel if parallel else self.serial
        return kernel(*args)


def sized_kernel(size_arg=0):
    """Decorator: compile ``func`` with ``prange`` parallel and serial; small calls run serially.

    Parameters
    ----------
    size_arg : int
        Position of the argument that measures the work: an array (its
        ``size``) or an int.
    """
    return lambda func: _SizedKernel(func, size_arg)
