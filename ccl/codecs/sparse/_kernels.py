"""numba kernels of the sparsifying codecs (``sidco``, ``topk``, ``dgc``).

Every kernel is a single streaming pass over its input. Reductions run with
``fastmath`` so that LLVM may reorder the float64 sums and vectorise them;
the inputs are finite (the base class filters NaN/Inf), which is what
``fastmath`` assumes. Kernels that read payloads never trust them: they
check every index before writing and return an error code instead.
"""

import math

import numpy as np

from ..._jit import njit

__all__ = [
    "abs_moments", "abs_log_moments_f32", "nonzero_log_sum", "count_above", "select_above",
    "compact_above", "take_top", "max_gap", "pack_gaps", "scatter_gaps", "scatter_absolute",
]

_FAST = dict(fastmath=True, error_model="numpy")


def _log1p_coefficients():
    # Least-squares polynomial for ln(m) with m = 1 + u in [sqrt(1/2), sqrt(2)):
    # degree 7 keeps the error near 6e-7, far below what a distribution fit needs.
    u = np.linspace(math.sqrt(0.5) - 1.0, math.sqrt(2.0) - 1.0, 4097)
    fit = np.polynomial.chebyshev.Chebyshev.fit(u, np.log1p(u), 7)
    return tuple(np.float32(c) for c in fit.convert(kind=np.polynomial.Polynomial).coef)


_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7 = _log1p_coefficients()
_LN2_F32 = np.float32(math.log(2.0))
_SQRT2_F32 = np.float32(math.sqrt(2.0))


@njit(**_FAST)
def abs_moments(x):
    """Return ``(sum |x|, sum x**2)`` accumulated in float64."""
    s1 = 0.0
    s2 = 0.0
    for i in range(x.size):
        v = np.float64(abs(x[i]))
        s1 += v
        s2 += v * v
    return s1, s2


@njit(**_FAST)
def abs_log_moments_f32(x, bits):
    """Return ``(sum |x|, sum x**2, sum ln|x| over nonzeros, nonzero count)`` for float32 ``x``.

    ``bits`` is ``x.view(np.uint32)``. The logarithm is computed from the
    exponent field and a polynomial in the mantissa, which vectorises (a
    libm ``log`` call does not and costs five times more). Subnormal inputs
    (below 1.2e-38) are read as if normal, a negligible error for a fit.
    """
    s1 = 0.0
    s2 = 0.0
    sl = 0.0
    nz = 0
    for i in range(x.size):
        a = abs(x[i])
        v = np.float64(a)
        s1 += v
        s2 += v * v
        nonzero = a != np.float32(0.0)
        nz += nonzero
        b = np.int32(bits[i] & np.uint32(0x7FFFFFFF))
        e = np.float32((b >> 23) - 127)
        m = np.float32(1.0) + np.float32(b & 0x7FFFFF) * np.float32(2.0 ** -23)
        big = m > _SQRT2_F32
        m = m * np.float32(0.5) if big else m
        e = e + np.float32(1.0) if big else e
        u = m - np.float32(1.0)
        ln_m = _C0 + u * (_C1 + u * (_C2 + u * (_C3 + u * (_C4 + u * (_C5 + u * (_C6 + u * _C7))))))
        ln_a = e * _LN2_F32 + ln_m
        sl += np.float64(ln_a if nonzero else np.float32(0.0))
    return s1, s2, sl, nz


@njit
def nonzero_log_sum(x):
    """Return ``(sum ln|x| over nonzeros, nonzero count)`` for any float dtype.

    Uses libm ``log``: slower than the polynomial of the float32 kernel.
    """
    sl = 0.0
    nz = 0
    for i in range(x.size):
        v = np.float64(abs(x[i]))
        if v > 0.0:
            sl += np.log(v)
            nz += 1
    return sl, nz


@njit(**_FAST)
def count_above(x, thr):
    """Return how many ``|x[i]| > thr``."""
    c = 0
    for i in range(x.size):
        c += abs(x[i]) > thr
    return c


@njit
def select_above(x, thr, out):
    """Write the indices with ``|x[i]| > thr`` (ascending) into ``out``; return how many.

    ``out`` must hold :func:`count_above` elements; extra hits are not written.
    """
    c = 0
    cap = out.size
    for i in range(x.size):
        if abs(x[i]) > thr:
            if c < cap:
                out[c] = i
            c += 1
    return c


@njit(**_FAST)
def compact_above(x, thr, out):
    """Copy the magnitudes ``|x[i]| > thr`` into ``out``, in order; return how many.

    ``out`` must hold one element more than :func:`count_above` finds: the
    loop stores every element and advances only past the kept ones, which
    avoids a mispredicted branch per element when many are kept.
    """
    c = 0
    last = out.size - 1
    for i in range(x.size):
        a = abs(x[i])
        out[c] = a
        c = min(c + (a > thr), last)
    return c


@njit
def take_top(x, v, quota, out):
    """Indices of ``|x| > v`` plus the first ``quota`` indices with ``|x| == v``, ascending.

    With ``v`` the k-th largest magnitude and ``quota = k - count(|x| > v)``
    this is the exact top-k with ties broken towards the lower index.
    Returns how many were written (at most ``out.size``).
    """
    c = 0
    cap = out.size
    for i in range(x.size):
        a = abs(x[i])
        if a > v or (a == v and quota > 0):
            if a == v:
                quota -= 1
            if c < cap:
                out[c] = i
                c += 1
    return c


@njit
def max_gap(idx):
    """Largest ``idx[j] - idx[j-1] - 1`` (with ``idx[-1] = -1``) of ascending indices."""
    prev = -1
    g = 0
    for j in range(idx.size):
        d = idx[j] - prev - 1
        if d > g:
            g = d
        prev = idx[j]
    return g


@njit
def pack_gaps(idx, w, out):
    """Bit-pack the gaps ``idx[j] - idx[j-1] - 1`` at ``w`` bits (LSB first) into uint32 words."""
    acc = np.uint64(0)
    nbits = 0
    o = 0
    prev = -1
    mask = np.uint64((1 << w) - 1)
    for j in range(idx.size):
        d = np.uint64(idx[j] - prev - 1) & mask
        prev = idx[j]
        acc |= d << np.uint64(nbits)
        nbits += w
        if nbits >= 32:
            out[o] = np.uint32(acc & np.uint64(0xFFFFFFFF))
            o += 1
            acc >>= np.uint64(32)
            nbits -= 32
    if nbits > 0:
        out[o] = np.uint32(acc)


@njit
def scatter_gaps(words, k, w, values, out):
    """Decode ``k`` gaps of ``w`` bits and write ``values`` at their indices in ``out``.

    Returns 0 on success, 1 if an index reaches ``out.size``, 2 if the
    padding bits after the last gap are not zero. ``words`` must hold
    ``ceil(k*w/32)`` words (checked by the caller); no write happens out of
    bounds whatever the words contain.
    """
    n = out.size
    acc = np.uint64(0)
    nbits = 0
    o = 0
    pos = -1
    mask = np.uint64((1 << w) - 1)
    for j in range(k):
        while nbits < w:
            acc |= np.uint64(words[o]) << np.uint64(nbits)
            o += 1
            nbits += 32
        pos += 1 + np.int64(acc & mask)
        if w > 0:
            acc >>= np.uint64(w)
            nbits -= w
        if pos >= n:
            return 1
        out[pos] = values[j]
    if acc != np.uint64(0):
        return 2
    while o < words.size:
        if words[o] != 0:
            return 2
        o += 1
    return 0


@njit
def scatter_absolute(idx, values, out):
    """Write ``values`` at the u32 indices ``idx``.

    Returns 0, or 1 if an index is out of range, 3 if they are not ascending.
    """
    n = out.size
    prev = -1
    for j in range(idx.size):
        i = np.int64(idx[j])
        if i <= prev:
            return 3
        if i >= n:
            return 1
        out[i] = values[j]
        prev = i
    return 0
