"""Device twin of the THC codec (see :mod:`.codec`): rotation, rounding, packing, lanes.

The rotation signs and rounding draws come from the same counter-based
streams as on the CPU (:func:`ccl.codecs._cuda_common.stream64`), element by
element, so the payload bytes are the CPU's. The Walsh-Hadamard transform
runs one radix-2 stage per launch.
"""

import numpy as np
from numba import cuda

from ..._xp import backend_of
from .._cuda_common import LOW32, TWO32, empty_body, launch, put, stream64
from ._tables import kernel_tables
from ..device import DeviceTwin
from ..header import FLAG_OVERFLOW
from .codec import BODY_HEADER_SIZE, KIND_PACKED

__all__ = ["THCTwin", "add_lanes"]


@cuda.jit(device=True)
def _flips(sign_seed, block, i):
    # the CPU's rotation sign of element i: bit (k % 64) of word (base + k - k % 64) / 64
    # of the sign stream, k = i - base, base = i's block start (thc _flip_signs)
    k = i % block
    word = stream64(sign_seed, np.uint64(i - k % 64) >> np.uint64(6))
    return (word >> np.uint64(k & 63)) & np.uint64(1)


@cuda.jit
def thc_fill(x, n, factor, sign_seed, block, out):
    """``out[i] = xi_i * float32(x[i] * factor)`` for i < n, zero padding after."""
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        if i < n:
            v = np.float32(np.float64(x[i]) * factor)
            out[i] = -v if _flips(sign_seed, block, i) else v
        else:
            out[i] = np.float32(0.0)


@cuda.jit
def fwht_stage(buf, h):
    """One radix-2 stage of the unnormalised Walsh-Hadamard transform (pairs h apart).

    Stage by stage gives the same float32 sums as the CPU's fused first
    three stages: every butterfly adds the same two operands.
    """
    for t in range(cuda.grid(1), buf.size // 2, cuda.gridsize(1)):
        i = (t // h) * 2 * h + t % h
        a = buf[i]
        b = buf[i + h]
        buf[i] = a + b
        buf[i + h] = a - b


@cuda.jit
def thc_round(rot, half, top, round_seed, xk, thr, idx):
    """Fine-grid stochastic rounding and table draw of rotated values (``encode_blocks``)."""
    ftop = np.float32(top)
    for k in range(cuda.grid(1), rot.size, cuda.gridsize(1)):
        v = min(max(rot[k] + half, np.float32(0.0)), ftop)
        j = np.uint32(v)
        r = stream64(round_seed, np.uint64(k))
        up = np.float32(np.uint32(r & LOW32)) < (v - np.float32(j)) * np.float32(TWO32)
        g = min(j + np.uint32(up), np.uint32(top))
        high = np.uint32(r >> np.uint64(32))
        idx[k] = xk[g] + np.uint8(high < thr[g])


@cuda.jit
def pack_msb(idx, bits, out):
    """MSB-first bit stream of ``bits``-bit values: byte o gathers the bits 8o..8o+7."""
    for o in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        byte = np.uint32(0)
        for b in range(8):
            g = 8 * o + b
            e = g // bits
            if e < idx.size:
                bit = (np.uint32(idx[e]) >> np.uint32(bits - 1 - g % bits)) & np.uint32(1)
                byte |= bit << np.uint32(7 - b)
        out[o] = np.uint8(byte)


@cuda.jit(device=True)
def _index_of(data, bits, k):
    # the k-th bits-bit value of an MSB-first bit stream
    value = np.uint32(0)
    for b in range(bits):
        g = k * bits + b
        value = (value << np.uint32(1)) | ((np.uint32(data[g // 8]) >> np.uint32(7 - g % 8))
                                            & np.uint32(1))
    return value


@cuda.jit(device=True)
def _lane(data, width, bits, levels, k):
    # lane k: a packed index mapped through levels (width 0) or a little-endian lane
    if width == 0:
        return np.uint32(levels[_index_of(data, bits, k)])
    lane = np.uint32(0)
    for b in range(width):
        lane |= np.uint32(data[width * k + b]) << np.uint32(8 * b)
    return lane


@cuda.jit
def thc_unrotated(data, width, bits, values, levels, offset, scale, out):
    """Pre-rotation values: ``values[index]`` (packed) or ``(lane - offset) * scale`` (lanes)."""
    for k in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        if width == 0:
            out[k] = values[_index_of(data, bits, k)]
        else:
            lane = _lane(data, width, bits, levels, k)
            out[k] = np.float32((np.float64(lane) - offset) * scale)


@cuda.jit
def thc_emit(rot, n, sign_seed, block, out):
    """``out[i] = xi_i * rot[i]`` for i < n (the inverse rotation's sign step)."""
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        v = rot[i]
        out[i] = -v if _flips(sign_seed, block, i) else v


@cuda.jit
def thc_add_lanes(a, a_width, b, b_width, bits, levels, out, out_width):
    """Lanes ``a + b`` as little-endian ``out_width``-byte integers."""
    for k in range(cuda.grid(1), out.size // out_width, cuda.gridsize(1)):
        s = _lane(a, a_width, bits, levels, k) + _lane(b, b_width, bits, levels, k)
        for shift in range(out_width):
            out[k * out_width + shift] = np.uint8((s >> np.uint32(8 * shift)) & np.uint32(0xFF))


def _fwht(buf, block, be):
    h = 1
    while h < block:
        launch(be, fwht_stage, buf.size // 2, buf, h)
        h *= 2


def add_lanes(a, a_width, b, b_width, bits, levels, padded, out, out_width):
    """Device twin of :func:`._kernels.add_lanes` (same arguments)."""
    be = backend_of(out)
    launch(be, thc_add_lanes, padded, a, a_width, b, b_width, bits, be.to_device(levels),
           out, out_width)


class THCTwin(DeviceTwin):
    """THC on the device: the CPU's bytes once the norm is agreed (``ctx.shared``)."""

    @staticmethod
    def encode(codec, x, ctx, be):
        xp = be.xp
        padded = codec._padded(x.size)
        with np.errstate(over="ignore"):
            max_norm = np.float32(codec._max_norm(x, ctx))
        if not np.isfinite(max_norm):
            return empty_body(be), FLAG_OVERFLOW
        zero = max_norm == 0 or padded == 0
        data_len = 0 if zero else padded * codec.bits // 8
        body = xp.empty(BODY_HEADER_SIZE + data_len, dtype=np.uint8)
        put(be, body[:BODY_HEADER_SIZE],
            codec._body_head(KIND_PACKED, 0, zero, max_norm, ctx, padded))
        if zero:
            return body, 0
        xk, thr = kernel_tables(codec.levels, codec.g)
        factor = codec._encode_factor(x.size, max_norm)
        if x.dtype != np.float32:
            x, factor = (x * factor).astype(np.float32), 1.0
        rot = xp.empty(padded, dtype=np.float32)
        launch(be, thc_fill, padded, x, x.size, factor, np.uint64(ctx.seed(codec.seed)),
               codec.block, rot)
        _fwht(rot, codec.block, be)
        idx = xp.empty(padded, dtype=np.uint8)
        top = xk.size - 1
        launch(be, thc_round, padded, rot, np.float32(0.5 * top), top,
               np.uint64(ctx.seed(codec.seed, per_rank=True)), be.to_device(xk),
               be.to_device(thr), idx)
        launch(be, pack_msb, data_len, idx, codec.bits, body[BODY_HEADER_SIZE:])
        return body, 0

    @staticmethod
    def decode(codec, header, body, ctx, be):
        xp = be.xp
        width, zero, max_norm, data = codec._parse(header, body, ctx)
        n = header.n
        if zero:
            return xp.zeros(n, dtype=np.float32)
        values, offset, scale = codec._dequantizer(header, max_norm)
        padded = codec._padded(n)
        rot = xp.empty(padded, dtype=np.float32)
        launch(be, thc_unrotated, padded, data, width, codec.bits, be.to_device(values),
               be.to_device(codec._levels_u32()), offset, scale, rot)
        _fwht(rot, codec.block, be)
        out = xp.empty(n, dtype=np.float32)
        launch(be, thc_emit, n, rot, n, np.uint64(ctx.seed(codec.seed)), codec.block, out)
        return out

    @staticmethod
    def add(codec, ha, a_body, hb, b_body, ctx, be):
        # the CPU code is array-agnostic but for the lane kernel: pass this twin's
        return codec._add_with(ha, a_body, hb, b_body, ctx, add_lanes)
