"""numba kernels of the ``dithering`` codec: the scale's reductions, the two roundings, decoding.

Reductions run per fixed block of :data:`BLOCK` values and add the blocks in
order, so the scale does not depend on the number of threads (the device
twin sums the same blocks).
"""

import math

import numpy as np

from ..._jit import njit, prange
from .._shared_kernels import sized_kernel, stream64

__all__ = ["BLOCK", "abs_max", "sum_squares", "uniform32", "dither_linear", "natural_level",
           "dither_natural", "dequantize_linear", "lookup"]

BLOCK = 1 << 15  # values per parallel block of the reductions
_TWO32 = 4294967296.0
_MASK32 = np.uint64(0xFFFFFFFF)
_MANT = np.uint64((1 << 52) - 1)


@sized_kernel()
def abs_max(x, partial):
    """max|x| by fixed blocks; eight running maxima keep the loop free of a serial chain."""
    n = x.size
    for b in prange(partial.size):
        start = b * BLOCK
        stop = min(start + BLOCK, n)
        m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = abs(np.float64(x[start]))
        i = start
        while i + 8 <= stop:
            m0 = max(m0, abs(np.float64(x[i])))
            m1 = max(m1, abs(np.float64(x[i + 1])))
            m2 = max(m2, abs(np.float64(x[i + 2])))
            m3 = max(m3, abs(np.float64(x[i + 3])))
            m4 = max(m4, abs(np.float64(x[i + 4])))
            m5 = max(m5, abs(np.float64(x[i + 5])))
            m6 = max(m6, abs(np.float64(x[i + 6])))
            m7 = max(m7, abs(np.float64(x[i + 7])))
            i += 8
        while i < stop:
            m0 = max(m0, abs(np.float64(x[i])))
            i += 1
        partial[b] = max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
    return partial.max()


@sized_kernel()
def sum_squares(x, partial):
    """sum x**2 in float64, by fixed blocks added in order (independent of the thread count)."""
    n = x.size
    for b in prange(partial.size):
        a0 = a1 = a2 = a3 = 0.0
        start = b * BLOCK
        stop = min(start + BLOCK, n)
        i = start
        while i + 4 <= stop:
            v0, v1, v2, v3 = np.float64(x[i]), np.float64(x[i + 1]), np.float64(x[i + 2]), \
                np.float64(x[i + 3])
            a0 += v0 * v0
            a1 += v1 * v1
            a2 += v2 * v2
            a3 += v3 * v3
            i += 4
        while i < stop:
            v = np.float64(x[i])
            a0 += v * v
            i += 1
        partial[b] = (a0 + a1) + (a2 + a3)
    total = 0.0
    for b in range(partial.size):
        total += partial[b]
    return total


@njit
def uniform32(seed, i):
    # 32 random bits for element i, as a float64 in [0, 2^32)
    return np.float64(stream64(seed, i) >> np.uint64(32))


@sized_kernel()
def dither_linear(x, factor, s, seed, out):
    """Round ``|x| * factor`` (``factor = s / scale``) stochastically to an integer in ``0..s``.

    ``t`` goes up to ``floor(t) + 1`` with probability ``t - floor(t)``, so the
    expected code is ``t``: unbiased.
    """
    top = np.float64(s)
    for i in prange(x.size):
        v = x[i]
        t = min(abs(np.float64(v)) * factor, top)
        low = math.floor(t)
        q = np.int32(low) + np.int32(uniform32(seed, i) < (t - low) * _TWO32)
        out[i] = -q if v < 0 else q


@njit
def natural_level(r, s, c_low):
    """``(j, p)``: ``r`` lies between level ``j`` and ``j + 1``; ``p`` is the chance of going up.

    For ``r`` in ``[2^(j-s), 2^(j-s+1))`` with ``j >= 1`` the gap equals the lower
    level, so ``p = r / 2^(j-s) - 1``, the mantissa's fraction; below level 1
    (``j = 0``, between 0 and ``2^(1-s)``) ``p = r * 2^(s-1)``. ``c_low`` is
    ``2^(s-1)`` when ``s <= 1000``, else 0, which selects the exact path for
    exponents a float64 cannot scale in one multiply.
    """
    if c_low == 0.0:
        if r == 0.0:
            return 0, 0.0
        mant, e2 = math.frexp(r)  # r = mant * 2^e2, mant in [0.5, 1)
        j = e2 - 1 + s
        if j >= 1:
            return j, 2.0 * mant - 1.0
        return 0, math.ldexp(r, s - 1)
    # r = 0 and subnormal r land in the second branch (j < 1), where r * c_low is exact
    bits = np.float64(r).view(np.uint64)
    j = np.int64(bits >> np.uint64(52)) - 1023 + s
    if j >= 1:
        return j, np.float64(bits & _MANT) * (1.0 / 4503599627370496.0)  # mantissa / 2^52
    return 0, r * c_low


@sized_kernel()
def dither_natural(x, inv_scale, s, c_low, seed, out):
    """Round ``|x| * inv_scale`` stochastically to a neighbouring power-of-two level index."""
    for i in prange(x.size):
        v = x[i]
        j, p = natural_level(min(abs(np.float64(v)) * inv_scale, 1.0), s, c_low)
        q = np.int32(j) + np.int32(uniform32(seed, i) < p * _TWO32)
        out[i] = -q if v < 0 else q


@sized_kernel()
def dequantize_linear(codes, step, out):
    """``out = codes * step``; return the largest ``|code|`` for the range check."""
    worst = 0
    for i in prange(codes.size):
        c = np.int32(codes[i])
        worst = max(worst, abs(c))
        out[i] = np.float32(np.float64(c) * step)
    return worst


@sized_kernel()
def lookup(codes, table, s, out):
    """``out[i] = table[codes[i] + s]``; return the largest ``|code|`` for the range check.

    Codes outside ``[-s, s]`` read a clamped entry, never outside ``table``.
    """
    worst = 0
    for i in prange(codes.size):
        c = np.int32(codes[i])
        worst = max(worst, abs(c))
        out[i] = table[min(max(c + s, 0), 2 * s)]
    return worst
