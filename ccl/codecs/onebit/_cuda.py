"""Device twin of the ``onebit`` codec (see :mod:`.codec`): the CPU's bytes, scale included."""

import numpy as np
from numba import cuda

from .._cuda_common import device_function, empty_body, launch, ordered_total, put
from ..device import DeviceTwin, body_buffer
from ..header import FLAG_OVERFLOW
from ._kernels import BLOCK_BYTES, bit as _cpu_bit
from .codec import _SCALE

__all__ = ["OneBitTwin"]

_bit = device_function(_cpu_bit.py_func)


@cuda.jit
def onebit_partial(x, full, block_bytes, partial):
    """``partial[8*b + t]`` = sum |x[8j + t]| over the bytes j of CPU block b (in order)."""
    for w in range(cuda.grid(1), partial.size, cuda.gridsize(1)):
        b = w // 8
        t = w % 8
        start = b * block_bytes
        stop = min(start + block_bytes, full)
        acc = np.float64(0.0)  # explicit: the simulator would keep a float32 sum in float32
        j = start
        # Eight loads are issued before their adds: each thread's sum is one long sequential
        # chain (the CPU's order), and the few threads there are (8 per 4 KB of bits) were
        # waiting on one load at a time (H100: 0.94 ms of a 256 MB encode).
        while j + 8 <= stop:
            i = 8 * j + t
            a0 = abs(x[i])
            a1 = abs(x[i + 8])
            a2 = abs(x[i + 16])
            a3 = abs(x[i + 24])
            a4 = abs(x[i + 32])
            a5 = abs(x[i + 40])
            a6 = abs(x[i + 48])
            a7 = abs(x[i + 56])
            acc += np.float64(a0)
            acc += np.float64(a1)
            acc += np.float64(a2)
            acc += np.float64(a3)
            acc += np.float64(a4)
            acc += np.float64(a5)
            acc += np.float64(a6)
            acc += np.float64(a7)
            j += 8
        while j < stop:
            acc += np.float64(abs(x[8 * j + t]))
            j += 1
        partial[w] = acc


@cuda.jit
def onebit_pack(x, bits):
    """Byte j of the sign bits (bit 7 - i%8 set where x[i] < 0); the last byte zero-padded."""
    n = x.size
    for j in range(cuda.grid(1), bits.size, cuda.gridsize(1)):
        byte = np.uint32(0)
        for t in range(8):
            i = 8 * j + t
            if i < n:
                byte |= _bit(x[i], 7 - t)
        bits[j] = np.uint8(byte)


@cuda.jit
def onebit_unpack(bits, scale, out):
    """``out[i] = -scale`` where sign bit i is set, ``+scale`` elsewhere."""
    pos = scale
    neg = -scale
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = neg if (bits[i // 8] >> (7 - i % 8)) & 1 else pos


class OneBitTwin(DeviceTwin):
    """``onebit`` on the device; ``sum|x|`` is added in the CPU kernel's order."""

    @staticmethod
    def encode(codec, x, ctx, be):
        xp = be.xp
        n = x.size
        full = n // 8
        nblocks = (full + BLOCK_BYTES - 1) // BLOCK_BYTES
        body = body_buffer(be, _SCALE.size + (n + 7) // 8)
        partial = xp.empty(8 * nblocks, dtype=np.float64)
        launch(be, onebit_partial, partial.size, x, full, BLOCK_BYTES, partial)
        launch(be, onebit_pack, body.size - _SCALE.size, x, body[_SCALE.size:])
        # the CPU's order: eight lane sums per block combined pairwise, blocks added in
        # order, then the tail one element at a time
        total = ordered_total(be.to_host(partial), 8)
        for v in be.to_host(x[8 * full:]):
            total += float(abs(v))
        mean = total / n if n else 0.0
        with np.errstate(over="ignore"):
            scale = np.float32(mean)
        if not np.isfinite(scale):
            return empty_body(be), FLAG_OVERFLOW
        put(be, body[:_SCALE.size], _SCALE.pack(scale))
        return body, 0

    @staticmethod
    def decode(codec, header, body, ctx, be):
        scale, bits = codec._parse(header, body)
        out = be.xp.empty(header.n, dtype=np.float32)
        launch(be, onebit_unpack, header.n, bits, scale, out)
        return out
