"""numba kernels of the ``onebit`` codec: pack the signs (summing ``|x|``), unpack them.

Sums are taken per fixed block of :data:`BLOCK_BYTES` packed bytes and then
added in block order, so the scale does not depend on the number of threads
(the device twin sums the same blocks).
"""

import numpy as np

from ..._jit import njit, prange
from .._shared_kernels import sized_kernel

__all__ = ["BLOCK_BYTES", "bit", "pack_signs", "unpack_signs"]

# Bytes of packed output per parallel block (32768 input values): large enough to
# amortise scheduling, small enough to give every thread work on a 1M-value chunk.
BLOCK_BYTES = 4096


@njit
def bit(v, shift):
    # 1 << shift where v is negative; zero and -0.0 count as positive
    return np.uint32(v < 0) << np.uint32(shift)


@sized_kernel()
def pack_signs(x, bits, partial):
    """Pack the signs of ``x`` into ``bits`` and return sum|x| in one pass.

    Sums are taken per fixed block and then added in block order, so the
    result does not depend on the number of threads.
    """
    n = x.size
    full = n // 8
    for b in prange(partial.size):
        start = b * BLOCK_BYTES
        stop = min(start + BLOCK_BYTES, full)
        # eight accumulators (one per bit position) break the add dependency chain
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
        for j in range(start, stop):
            i = 8 * j
            v0, v1, v2, v3 = x[i], x[i + 1], x[i + 2], x[i + 3]
            v4, v5, v6, v7 = x[i + 4], x[i + 5], x[i + 6], x[i + 7]
            a0 += abs(v0)
            a1 += abs(v1)
            a2 += abs(v2)
            a3 += abs(v3)
            a4 += abs(v4)
            a5 += abs(v5)
            a6 += abs(v6)
            a7 += abs(v7)
            bits[j] = np.uint8(bit(v0, 7) | bit(v1, 6) | bit(v2, 5) | bit(v3, 4)
                               | bit(v4, 3) | bit(v5, 2) | bit(v6, 1) | bit(v7, 0))
        partial[b] = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
    total = 0.0
    for b in range(partial.size):
        total += partial[b]
    if n > 8 * full:
        last = np.uint32(0)
        for i in range(8 * full, n):
            v = x[i]
            total += abs(v)
            last |= bit(v, 7 - (i - 8 * full))
        bits[full] = np.uint8(last)
    return total


@sized_kernel(size_arg=2)
def unpack_signs(bits, scale, out):
    """Write ``-scale`` where the bit is set and ``+scale`` elsewhere."""
    n = out.size
    full = n // 8
    pos = np.float32(scale)
    neg = -pos
    for j in prange(full):
        byte = bits[j]
        for t in range(8):
            out[8 * j + t] = neg if (byte >> (7 - t)) & 1 else pos
    for i in range(8 * full, n):
        out[i] = neg if (bits[full] >> (7 - (i - 8 * full))) & 1 else pos
