"""Device twin of the 3LC codec (see :mod:`.codec`): max-abs, quartic folding, zero runs.

The fold and unfold are one thread per quartic byte with the CPU's digit
rule (:func:`._kernels._digit`, compiled for the device).
Zero-run coding, serial on the CPU, becomes a prefix sum: every byte learns
where its code goes from an exclusive ``cumsum`` of the code lengths, then
one kernel writes.
"""

import numpy as np
from numba import cuda

from . import _kernels as K
from .._cuda_common import device_function, empty_body, launch, put, zeros
from ..device import DeviceTwin, body_buffer
from ..header import FLAG_OVERFLOW
from .codec import (_ABS_MASKS, _BODY_HEADER, BODY_HEADER_SIZE, LAYOUT_FIVE_PARTITIONS,
                      _check, quartic_len, scale_for)

__all__ = ["ThreeLCTwin", "zre_encode"]

_digit = device_function(K._digit.py_func)


@cuda.jit
def masked_max(bits, mask, out):
    """``out[0] = max(bits[i] & mask)`` (an integer max: order-independent)."""
    top = mask ^ mask  # zero of the mask's (and the output's) integer type
    for i in range(cuda.grid(1), bits.size, cuda.gridsize(1)):
        top = max(top, bits[i] & mask)
    cuda.atomic.max(out, 0, top)


@cuda.jit
def threelc_fold(x, M, L, out):
    """Quantize with scale M and fold byte i from element i of the five partitions."""
    n = x.size
    for i in range(cuda.grid(1), L, cuda.gridsize(1)):
        a = np.int32(0)
        for k in range(5):
            j = k * L + i
            a = 3 * a + (_digit(x[j], M) if j < n else np.int32(1))
        out[i] = np.uint8(a)


@cuda.jit
def zre_scatter(a, runs, offsets, out):
    """Zero-run encode: byte i goes to ``offsets[i]``; a run start writes its run's codes."""
    for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
        b = a[i]
        o = offsets[i]
        if b != K.ZERO_BYTE:
            out[o] = b
        else:
            r = runs[i]  # the run's length at its first byte, 0 inside a run
            while r >= K.MAX_RUN:
                out[o] = 255
                o += 1
                r -= K.MAX_RUN
            if r == 1:
                out[o] = K.ZERO_BYTE
            elif r >= 2:
                out[o] = np.uint8(K.RUN_BASE + r)


@cuda.jit
def zre_expand(z, offsets, out):
    """Zero-run decode: code p expands at ``offsets[p]`` (lengths checked by the caller)."""
    for p in range(cuda.grid(1), z.size, cuda.gridsize(1)):
        b = z[p]
        o = offsets[p]
        if b <= K.MAX_DIGIT_BYTE:
            out[o] = b
        else:
            for j in range(o, o + np.int64(b) - K.RUN_BASE):
                out[j] = K.ZERO_BYTE


@cuda.jit
def threelc_unfold(a, M, y, err):
    """Unfold quartic bytes into ``M * (digit - 1)``; ``err`` bit 0: bad pad, bit 1: M=0 data."""
    n = y.size
    L = a.size
    for i in range(cuda.grid(1), L, cuda.gridsize(1)):
        b = np.int32(a[i])
        if M == 0 and b != K.ZERO_BYTE:
            cuda.atomic.or_(err, 0, 2)
        div = 81
        for k in range(5):
            d = (b // div) % 3
            div //= 3
            j = k * L + i
            if j < n:
                y[j] = M * np.float32(d - 1)
            elif d != 1:
                cuda.atomic.or_(err, 0, 1)


def _max_abs(x, be):
    """max|x| of a finite float32/float64 device array, as a Python float."""
    if x.size == 0:
        return 0.0
    # masked_max, not a cupy.ReductionKernel: on an H100 the 256 MB encode ran at 5 GB/s
    # with such a reduction here, and at 94 GB/s with masked_max (0.8 ms of it)
    utype, mask = _ABS_MASKS[x.dtype]
    out = zeros(be, dtype=utype)
    launch(be, masked_max, x.size, x.view(utype), mask, out)
    return float(be.to_host(out).view(x.dtype)[0])


def _exclusive_cumsum(xp, sizes):
    offsets = xp.cumsum(sizes)
    total = int(offsets[-1]) if sizes.size else 0
    return offsets - sizes, total


def zre_encode(digits, out, be):
    """Zero-run encode ``digits`` into ``out`` (at least as long); return the length written.

    Runs of the all-zero byte are found with two flag arrays (first and last
    byte of each run); every byte learns where its code goes from an
    exclusive prefix sum of the code lengths, then one kernel writes.
    """
    xp = be.xp
    L = digits.size
    if L == 0:
        return 0
    zero = digits == K.ZERO_BYTE
    before = xp.zeros(L, dtype=bool)
    before[1:] = zero[:-1]
    after = xp.zeros(L, dtype=bool)
    after[:-1] = zero[1:]
    starts = xp.flatnonzero(zero & ~before)
    lengths = xp.flatnonzero(zero & ~after) + 1 - starts
    runs = xp.zeros(L, dtype=np.int64)
    runs[starts] = lengths
    sizes = (~zero).astype(np.int64)
    sizes[starts] = lengths // K.MAX_RUN + (lengths % K.MAX_RUN > 0)
    offsets, total = _exclusive_cumsum(xp, sizes)
    launch(be, zre_scatter, L, digits, runs, offsets, out)
    return total


class ThreeLCTwin(DeviceTwin):
    """3LC on the device: the CPU's bytes (every step is exact)."""

    @staticmethod
    def encode(codec, x, ctx, be):
        xp = be.xp
        n = x.size
        L = quartic_len(n)
        M = scale_for(_max_abs(x, be), codec.s)
        if M is None:
            return empty_body(be), FLAG_OVERFLOW
        digits = xp.empty(L, dtype=np.uint8)
        if M == 0.0:
            digits[:] = K.ZERO_BYTE
        else:
            launch(be, threelc_fold, L, x, x.dtype.type(M), L, digits)
        body = body_buffer(be, BODY_HEADER_SIZE + L)
        zlen = zre_encode(digits, body[BODY_HEADER_SIZE:], be)
        put(be, body[:BODY_HEADER_SIZE], _BODY_HEADER.pack(LAYOUT_FIVE_PARTITIONS, M, L, zlen))
        return body[:BODY_HEADER_SIZE + zlen], 0

    @staticmethod
    def decode(codec, header, body, ctx, be):
        xp = be.xp
        M, L, _ = codec._parse(header, body)
        z = body[BODY_HEADER_SIZE:]
        sizes = xp.where(z <= K.MAX_DIGIT_BYTE, 1, z.astype(np.int64) - K.RUN_BASE)
        offsets, total = _exclusive_cumsum(xp, sizes)
        if total != L:
            _check(K.ERR_OVERFLOW if total > L else K.ERR_SHORT, "zero-run stream")
        digits = xp.empty(L, dtype=np.uint8)
        launch(be, zre_expand, z.size, z, offsets, digits)
        y = xp.empty(header.n, dtype=np.float32)
        err = zeros(be)
        launch(be, threelc_unfold, L, digits, np.float32(M), y, err)
        code = int(be.to_host(err)[0]) if L else 0
        if code:
            _check(K.ERR_PAD if code & 1 else K.ERR_NONZERO, "quartic stream")
        return y
