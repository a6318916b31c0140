"""numba kernels of the cast codecs: float32 to and from IEEE half and bfloat16 bits.

Each encoder writes the 16-bit patterns of its input and returns True if a
finite value did not fit the format (it became Inf); the codec then flags
the payload ``OVERFLOW``.
"""

import numpy as np

from ..._jit import njit

__all__ = ["to_fp16", "from_fp16", "FP16_TO_FP32", "to_bf16"]


@njit
def to_fp16(x, out):
    # float32 -> IEEE half bits, round to nearest even, branch-free so it vectorises
    # (bit-exact with numpy's cast). Returns True if a finite input became Inf.
    bits = x.view(np.uint32)
    largest = np.uint32(0)
    for i in range(x.size):
        u = bits[i]
        a = u & np.uint32(0x7FFFFFFF)
        # normal halves: round the mantissa at bit 13 (ties to even), rebias 127 -> 15
        normal = ((a + np.uint32(0xFFF) + ((a >> np.uint32(13)) & np.uint32(1)))
                  >> np.uint32(13)) - np.uint32(0x1C000)
        # subnormal halves count units of 2^-24; the scaling is exact, rint rounds to even
        subnormal = np.uint32(np.rint(abs(x[i]) * np.float32(16777216.0)))
        half = subnormal if a < np.uint32(0x38800000) else normal
        half = np.uint32(0x7C00) if a >= np.uint32(0x477FF000) else half
        out[i] = np.uint16(((u >> np.uint32(16)) & np.uint32(0x8000)) | half)
        largest = max(largest, a)
    return largest >= np.uint32(0x477FF000)  # 65520 and above round to Inf


def _fp16_table():
    # every half bit pattern's float32 value: decoding is one table lookup per value
    return np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


FP16_TO_FP32 = _fp16_table()


@njit
def from_fp16(halves, table, out):
    for i in range(halves.size):
        out[i] = table[halves[i]]


@njit
def to_bf16(x, out):
    # Round to nearest, ties to even, on the top 16 bits of the float32 pattern.
    bits = x.view(np.uint32)
    overflow = False
    for i in range(x.size):
        u = bits[i]
        rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        out[i] = np.uint16(rounded)
        if (rounded & np.uint32(0x7F80)) == np.uint32(0x7F80):
            overflow = True
    return overflow
