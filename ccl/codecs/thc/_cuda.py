"""Device twin of the THC codec (see :mod:`.codec`): rotation, rounding, packing, lanes.

The rotation signs and rounding draws come from the same counter-based
streams as on the CPU (:func:`ccl.codecs._cuda_common.stream64`), element by
element, so the payload bytes are the CPU's. Rotation blocks of up to
:data:`SHARED_BLOCK` values are rotated and rounded (or decoded and
unrotated) by one kernel, a thread block per rotation block in shared
memory; larger blocks take one launch per radix-2 stage of the
Walsh-Hadamard transform. Both do the same butterflies in the same order,
so both give the CPU's float32 sums.
"""

import numpy as np
from numba import cuda

from ..._xp import backend_of
from .._cuda_common import LOW32, TWO32, empty_body, launch, launch_blocks, put, stream64
from ._tables import kernel_tables
from ..device import DeviceTwin, body_buffer
from ..header import FLAG_OVERFLOW
from .codec import BODY_HEADER_SIZE, KIND_PACKED

__all__ = ["THCTwin", "add_lanes", "SHARED_BLOCK"]

#: The largest rotation block transformed in shared memory (float32: 16 KB). On an H100 the
#: stage-per-launch transform of a 1024 block was 2.7 of a 256 MB encode's 7 ms.
SHARED_BLOCK = 4096


@cuda.jit(device=True)
def _flips(sign_seed, block, i):
    # the CPU's rotation sign of element i: bit (k % 64) of word (base + k - k % 64) / 64
    # of the sign stream, k = i - base, base = i's block start (thc _flip_signs)
    k = i % block
    word = stream64(sign_seed, np.uint64(i - k % 64) >> np.uint64(6))
    return (word >> np.uint64(k & 63)) & np.uint64(1)


@cuda.jit(device=True)
def _signed(v, sign_seed, block, i):
    # xi_i * v: the rotation's sign step (forward and inverse alike)
    return -v if _flips(sign_seed, block, i) else v


@cuda.jit(device=True)
def _filled(x, n, factor, sign_seed, block, i):
    # xi_i * float32(x[i] * factor) for i < n, zero padding after
    if i < n:
        return _signed(np.float32(np.float64(x[i]) * factor), sign_seed, block, i)
    return np.float32(0.0)


@cuda.jit
def thc_fill(x, n, factor, sign_seed, block, out):
    """``out[i] = xi_i * float32(x[i] * factor)`` for i < n, zero padding after."""
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = _filled(x, n, factor, sign_seed, block, i)


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


@cuda.jit(device=True)
def _rounded(value, k, half, top, round_seed, xk, thr):
    # fine-grid stochastic rounding and table draw of rotated value k (encode_blocks)
    v = min(max(value + half, np.float32(0.0)), np.float32(top))
    j = np.uint32(v)
    r = stream64(round_seed, np.uint64(k))
    up = np.float32(np.uint32(r & LOW32)) < (v - np.float32(j)) * np.float32(TWO32)
    g = min(j + np.uint32(up), np.uint32(top))
    high = np.uint32(r >> np.uint64(32))
    return xk[g] + np.uint8(high < thr[g])


@cuda.jit
def thc_round(rot, half, top, round_seed, xk, thr, idx):
    """Fine-grid stochastic rounding and table draw of rotated values (``encode_blocks``)."""
    for k in range(cuda.grid(1), rot.size, cuda.gridsize(1)):
        idx[k] = _rounded(rot[k], k, half, top, round_seed, xk, thr)


@cuda.jit(device=True)
def _fwht_shared(buf, block, length):
    # every radix-2 stage of the length/block rotation blocks in shared memory, the threads
    # of the thread block together
    h = 1
    while h < block:
        for t in range(cuda.threadIdx.x, length // 2, cuda.blockDim.x):
            i = (t // h) * 2 * h + t % h
            a = buf[i]
            b = buf[i + h]
            buf[i] = a + b
            buf[i + h] = a - b
        cuda.syncthreads()
        h *= 2


@cuda.jit
def thc_encode_shared(x, n, factor, sign_seed, block, tile, half, top, round_seed, xk, thr,
                      idx):
    """``thc_fill``, the transform and ``thc_round``: whole blocks per thread block."""
    buf = cuda.shared.array(SHARED_BLOCK, np.float32)
    for piece in range(cuda.blockIdx.x, -(-idx.size // tile), cuda.gridDim.x):
        base = piece * tile
        length = min(tile, idx.size - base)
        for k in range(cuda.threadIdx.x, length, cuda.blockDim.x):
            buf[k] = _filled(x, n, factor, sign_seed, block, base + k)
        cuda.syncthreads()
        _fwht_shared(buf, block, length)
        for k in range(cuda.threadIdx.x, length, cuda.blockDim.x):
            idx[base + k] = _rounded(buf[k], base + k, half, top, round_seed, xk, thr)
        cuda.syncthreads()  # the tile is read before the next one overwrites it


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


@cuda.jit(device=True)
def _unrotated(data, width, bits, values, levels, offset, scale, k):
    # value k before the inverse rotation: values[index] (packed) or (lane - offset) * scale
    if width == 0:
        return values[_index_of(data, bits, k)]
    lane = _lane(data, width, bits, levels, k)
    return np.float32((np.float64(lane) - offset) * scale)


@cuda.jit
def thc_unrotated(data, width, bits, values, levels, offset, scale, out):
    """Pre-rotation values: ``values[index]`` (packed) or ``(lane - offset) * scale`` (lanes)."""
    for k in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[k] = _unrotated(data, width, bits, values, levels, offset, scale, k)


@cuda.jit
def thc_decode_shared(data, width, bits, values, levels, offset, scale, n, sign_seed, block,
                      tile, out):
    """``thc_unrotated``, the transform and ``thc_emit``: whole blocks per thread block."""
    buf = cuda.shared.array(SHARED_BLOCK, np.float32)
    padded = -(-n // block) * block
    for piece in range(cuda.blockIdx.x, -(-padded // tile), cuda.gridDim.x):
        base = piece * tile
        length = min(tile, padded - base)
        for k in range(cuda.threadIdx.x, length, cuda.blockDim.x):
            buf[k] = _unrotated(data, width, bits, values, levels, offset, scale, base + k)
        cuda.syncthreads()
        _fwht_shared(buf, block, length)
        for k in range(cuda.threadIdx.x, length, cuda.blockDim.x):
            if base + k < n:
                out[base + k] = _signed(buf[k], sign_seed, block, base + k)
        cuda.syncthreads()


@cuda.jit
def thc_emit(rot, n, sign_seed, block, out):
    """``out[i] = xi_i * rot[i]`` for i < n (the inverse rotation's sign step)."""
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        out[i] = _signed(rot[i], sign_seed, block, i)


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


def _tile(block, padded):
    """Values per thread block of the shared-memory kernels: whole rotation blocks."""
    return block * max(1, min(SHARED_BLOCK, padded) // block)


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
        body = body_buffer(be, BODY_HEADER_SIZE + data_len)
        put(be, body[:BODY_HEADER_SIZE],
            codec._body_head(KIND_PACKED, 0, zero, max_norm, ctx, padded))
        if zero:
            return body, 0
        xk, thr = kernel_tables(codec.levels, codec.g)
        factor = codec._encode_factor(x.size, max_norm)
        if x.dtype != np.float32:
            x, factor = (x * factor).astype(np.float32), 1.0
        idx = xp.empty(padded, dtype=np.uint8)
        top = xk.size - 1
        signs = np.uint64(ctx.seed(codec.seed))
        rounding = (np.float32(0.5 * top), top, np.uint64(ctx.seed(codec.seed, per_rank=True)),
                    be.to_device(xk), be.to_device(thr))
        if codec.block <= SHARED_BLOCK:
            tile = _tile(codec.block, padded)
            launch_blocks(be, thc_encode_shared, -(-padded // tile), x, x.size, factor, signs,
                          codec.block, tile, *rounding, idx)
        else:
            rot = xp.empty(padded, dtype=np.float32)
            launch(be, thc_fill, padded, x, x.size, factor, signs, codec.block, rot)
            _fwht(rot, codec.block, be)
            launch(be, thc_round, padded, rot, *rounding, idx)
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
        lanes = (data, width, codec.bits, be.to_device(values),
                 be.to_device(codec._levels_u32()), offset, scale)
        signs = np.uint64(ctx.seed(codec.seed))
        out = xp.empty(n, dtype=np.float32)
        if codec.block <= SHARED_BLOCK:
            tile = _tile(codec.block, padded)
            launch_blocks(be, thc_decode_shared, -(-padded // tile), *lanes, n, signs,
                          codec.block, tile, out)
            return out
        rot = xp.empty(padded, dtype=np.float32)
        launch(be, thc_unrotated, padded, *lanes, rot)
        _fwht(rot, codec.block, be)
        launch(be, thc_emit, n, rot, n, signs, codec.block, out)
        return out

    @staticmethod
    def add(codec, ha, a_body, hb, b_body, ctx, be):
        # the CPU code is array-agnostic but for the lane kernel: pass this twin's
        return codec._add_with(ha, a_body, hb, b_body, ctx, add_lanes)
