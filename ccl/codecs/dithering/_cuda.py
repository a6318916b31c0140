"""Device twin of the ``dithering`` codec (see :mod:`.codec`): the CPU's bytes.

The L2 scale repeats the CPU kernel's summation order (four running sums
per block, blocks in order), and each element's rounding draws the same
SplitMix64 word as on the CPU.
"""

import math

import numpy as np
from numba import cuda

from ...errors import PayloadError
from .._cuda_common import TWO32, empty_body, launch, mul_rn, ordered_total, put, stream64
from .._shared_kernels import f32_round_up
from ..device import DeviceTwin, body_buffer
from ._kernels import BLOCK
from .codec import _SCALE
from ..header import FLAG_OVERFLOW

__all__ = ["DitheringTwin"]


@cuda.jit
def sum_squares_partial(x, block, partial):
    """The CPU's four running sums per block: ``partial[4b + t]``.

    Lane t of block b adds ``x[i]**2`` for i = start + t, start + t + 4, ...
    while a whole group of four fits; lane 0 then adds the block's tail, as
    the CPU loop does.
    """
    n = x.size
    for w in range(cuda.grid(1), partial.size, cuda.gridsize(1)):
        b = w // 4
        t = w % 4
        start = b * block
        stop = min(start + block, n)
        groups = (stop - start) // 4
        acc = np.float64(0.0)
        for g in range(groups):
            v = np.float64(x[start + 4 * g + t])
            acc += mul_rn(v, v)
        if t == 0:
            for i in range(start + 4 * groups, stop):
                v = np.float64(x[i])
                acc += mul_rn(v, v)
        partial[w] = acc


@cuda.jit
def dither_linear(x, factor, s, seed, out):
    """Stochastic rounding of ``|x| * factor`` to 0..s (``_kernels.dither_linear``)."""
    top = np.float64(s)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        v = x[i]
        t = min(abs(np.float64(v)) * factor, top)
        low = math.floor(t)
        u = np.float64(stream64(seed, i) >> np.uint64(32))
        q = np.int32(low) + np.int32(u < (t - low) * TWO32)
        out[i] = -q if v < 0 else q


@cuda.jit
def dither_natural(x, inv_scale, s, seed, out):
    """Stochastic rounding to power-of-two levels (``_kernels.dither_natural``).

    Uses the CPU's frexp branch for every ``s``: for r in [0, 1] it gives
    the same level and probability as the CPU's exponent-bits branch.
    """
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        v = x[i]
        r = min(abs(np.float64(v)) * inv_scale, 1.0)
        j = 0
        p = 0.0
        if r != 0.0:
            mant, e2 = math.frexp(r)
            j = e2 - 1 + s
            if j >= 1:
                p = 2.0 * mant - 1.0
            else:
                j = 0
                p = math.ldexp(r, s - 1)
        u = np.float64(stream64(seed, i) >> np.uint64(32))
        q = np.int32(j) + np.int32(u < p * TWO32)
        out[i] = -q if v < 0 else q


def _sum_squares(x, be):
    """sum x**2 in float64, in the CPU kernel's order (bit-identical)."""
    nblocks = (x.size + BLOCK - 1) // BLOCK
    partial = be.xp.empty(4 * nblocks, dtype=np.float64)
    launch(be, sum_squares_partial, partial.size, x, BLOCK, partial)
    return ordered_total(be.to_host(partial), 4)


class DitheringTwin(DeviceTwin):
    """``dithering`` on the device."""

    @staticmethod
    def encode(codec, x, ctx, be):
        xp = be.xp
        n = x.size
        width = codec.code_dtype.itemsize
        body = body_buffer(be, _SCALE.size + n * width)
        if n == 0:
            statistic = 0.0
        elif codec.norm == "l2":
            statistic = math.sqrt(_sum_squares(x, be))
        else:
            statistic = float(xp.abs(x).max())
        scale = f32_round_up(statistic) if n else 0.0
        if scale is None:
            return empty_body(be), FLAG_OVERFLOW
        put(be, body[:_SCALE.size], _SCALE.pack(scale))
        if scale > 0.0:
            codes = body[_SCALE.size:].view(codec.code_dtype)
            seed = np.uint64(ctx.seed(codec.seed, per_rank=True))
            s = codec.levels
            if codec.partition == "linear":
                launch(be, dither_linear, n, x, s / scale, s, seed, codes)
            else:
                launch(be, dither_natural, n, x, 1.0 / scale, s, seed, codes)
        else:
            body[_SCALE.size:].fill(0)
        return body, 0

    @staticmethod
    def decode(codec, header, body, ctx, be):
        xp = be.xp
        scale = codec._parse(header, body)
        s = codec.levels
        if not header.n:
            return xp.empty(0, dtype=np.float32)
        codes = body[_SCALE.size:].view(codec.code_dtype).astype(np.int32)
        if int(xp.abs(codes).max()) > s:
            raise PayloadError(f"dithering: codes outside -{s}..{s}")
        if codec.partition == "linear":
            # float64 product rounded once to float32, as the CPU kernel
            return (codes.astype(np.float64) * (scale / s)).astype(np.float32)
        return be.to_device(codec._table(scale))[codes + s]
