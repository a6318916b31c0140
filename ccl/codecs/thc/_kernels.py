"""numba kernels of the THC codec: rotation, stochastic rounding, bit packing, lanes.

Randomness is counter based: element ``i`` of a stream seeded with ``s``
uses ``splitmix64(s + (i + 1) * GAMMA)``, so any block can be processed
independently (and in parallel) and every rank draws the same rotation
signs from the same shared seed. Rotation sign ``i`` is bit ``i % 64`` of
word ``i // 64`` of the sign stream; stochastic rounding of element ``i``
uses the low 32 bits of word ``i`` of the per-rank stream for the fine-grid
draw and the high 32 bits for the table draw.

Packed indices are an MSB-first bit stream: element 0 occupies the highest
``bits`` bits of byte 0 (for 4 bits: the high nibble), the last partial byte
is padded with zero bits.

The kernels loop over rotation blocks and every block is independent (the
random streams are indexed by element), so they could run blocks in
parallel with ``prange``; they are serial on purpose: ranks usually own a
core each, and ``parallel=True`` would triple the compile time.
"""

import numpy as np

from ..._jit import njit

__all__ = ["fwht", "rotate", "encode_blocks", "decode_blocks", "add_lanes", "pack_bits",
           "unpack_bits", "sum_squares"]

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_LOW32 = np.uint64(0xFFFFFFFF)
_TWO32 = 4294967296.0


@njit
def _mix(seed, i):
    # splitmix64 output for counter i: a strong 64-bit hash of (seed, i)
    z = seed + (np.uint64(i) + np.uint64(1)) * _GAMMA
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@njit
def fwht(buf):
    """Unnormalised in-place Walsh-Hadamard transform of ``buf`` (power-of-two length).

    Applying it twice multiplies by ``buf.size``.
    """
    length = buf.size
    h = 1
    if length >= 8:
        # the first three stages fused into one 8-point butterfly: short strides do not vectorise
        for k in range(0, length, 8):
            a0 = buf[k] + buf[k + 1]
            a1 = buf[k] - buf[k + 1]
            a2 = buf[k + 2] + buf[k + 3]
            a3 = buf[k + 2] - buf[k + 3]
            a4 = buf[k + 4] + buf[k + 5]
            a5 = buf[k + 4] - buf[k + 5]
            a6 = buf[k + 6] + buf[k + 7]
            a7 = buf[k + 6] - buf[k + 7]
            b0 = a0 + a2
            b2 = a0 - a2
            b1 = a1 + a3
            b3 = a1 - a3
            b4 = a4 + a6
            b6 = a4 - a6
            b5 = a5 + a7
            b7 = a5 - a7
            buf[k] = b0 + b4
            buf[k + 4] = b0 - b4
            buf[k + 1] = b1 + b5
            buf[k + 5] = b1 - b5
            buf[k + 2] = b2 + b6
            buf[k + 6] = b2 - b6
            buf[k + 3] = b3 + b7
            buf[k + 7] = b3 - b7
        h = 8
    while h < length:
        for i in range(0, length, 2 * h):
            # two disjoint views: LLVM vectorises them, but not buf[j] vs buf[j + h]
            lo = buf[i:i + h]
            hi = buf[i + h:i + 2 * h]
            for j in range(h):
                a = lo[j]
                b = hi[j]
                lo[j] = a + b
                hi[j] = a - b
        h *= 2


@njit
def _flip_signs(bits, start, count, sign_seed):
    # negate bits[:count] (float32 bit patterns of elements start.. start+count-1) where the
    # rotation sign is -1: bit (i % 64) of word (i // 64) of the sign stream; start % 64 == 0
    for k0 in range(0, count, 64):
        word = _mix(sign_seed, (start + k0) >> 6)
        for k in range(k0, min(k0 + 64, count)):
            bits[k] ^= np.uint32((word >> np.uint64(k & 63)) << np.uint64(31))


@njit
def _fill_signed(x, n, base, block, factor, sign_seed, scratch):
    # scratch = xi * x[base:base+block] * factor, zero-padded past n
    m = max(min(block, n - base), 0)
    src = x[base:base + m]
    for k in range(m):
        scratch[k] = np.float32(src[k] * factor)
    for k in range(m, block):
        scratch[k] = np.float32(0.0)
    _flip_signs(scratch.view(np.uint32), base, m, sign_seed)


@njit
def _emit_signed(scratch, n, base, block, sign_seed, out):
    # out[base:base+block] = xi * scratch, truncated at n
    m = max(min(block, n - base), 0)
    _flip_signs(scratch.view(np.uint32), base, m, sign_seed)
    dst = out[base:base + m]
    for k in range(m):
        dst[k] = scratch[k]


@njit
def rotate(x, block, factor, sign_seed, inverse):
    """Blocked randomized Hadamard transform of float32 ``x`` (a tool for tests).

    Forward: ``H(xi * x) * factor``, zero-padded to a multiple of ``block``.
    Inverse: ``xi * H(x) * factor`` (``x.size`` a multiple of ``block``). ``H``
    is unnormalised; ``factor = 1/sqrt(block)`` makes it orthonormal.
    """
    padded = (x.size + block - 1) // block * block
    out = np.empty(padded, dtype=np.float32)
    scratch = np.empty(block, dtype=np.float32)
    for base in range(0, padded, block):
        if inverse:
            for k in range(block):
                scratch[k] = np.float32(x[base + k] * factor)
            fwht(scratch)
            _emit_signed(scratch, padded, base, block, sign_seed, out)
        else:
            _fill_signed(x, x.size, base, block, factor, sign_seed, scratch)
            fwht(scratch)
            out[base:base + block] = scratch
    return out


@njit
def _pack_into(idx, count, bits, out, off):
    # MSB-first bit stream of count b-bit values into out[off:]; byte aligned start
    if bits == 4:
        pairs = count // 2
        for i in range(pairs):
            out[off + i] = (idx[2 * i] << np.uint8(4)) | idx[2 * i + 1]
        if count & 1:
            out[off + pairs] = idx[count - 1] << np.uint8(4)
    elif bits == 2:
        quads = count // 4
        for i in range(quads):
            out[off + i] = ((idx[4 * i] << np.uint8(6)) | (idx[4 * i + 1] << np.uint8(4))
                            | (idx[4 * i + 2] << np.uint8(2)) | idx[4 * i + 3])
        tail = np.uint8(0)
        for k in range(4 * quads, count):
            tail |= idx[k] << np.uint8(6 - 2 * (k - 4 * quads))
        if count & 3:
            out[off + quads] = tail
    else:
        first = 0
        o = off
        if bits == 3:
            for grp in range(count // 8):
                word = np.uint32(0)
                for t in range(8):
                    word |= np.uint32(idx[8 * grp + t]) << np.uint32(21 - 3 * t)
                out[off + 3 * grp] = np.uint8(word >> np.uint32(16))
                out[off + 3 * grp + 1] = np.uint8((word >> np.uint32(8)) & np.uint32(0xFF))
                out[off + 3 * grp + 2] = np.uint8(word & np.uint32(0xFF))
            first = count // 8 * 8
            o = off + 3 * (count // 8)
        acc = np.uint32(0)
        nacc = 0
        for k in range(first, count):
            acc = (acc << np.uint32(bits)) | np.uint32(idx[k])
            nacc += bits
            if nacc >= 8:
                nacc -= 8
                out[o] = np.uint8((acc >> np.uint32(nacc)) & np.uint32(0xFF))
                o += 1
        if nacc > 0:
            out[o] = np.uint8((acc << np.uint32(8 - nacc)) & np.uint32(0xFF))


@njit
def _unpack_from(data, off, bits, count, idx):
    # inverse of _pack_into
    if bits == 4:
        for i in range(count // 2):
            byte = data[off + i]
            idx[2 * i] = byte >> np.uint8(4)
            idx[2 * i + 1] = byte & np.uint8(15)
        if count & 1:
            idx[count - 1] = data[off + count // 2] >> np.uint8(4)
    elif bits == 2:
        for k in range(count):
            idx[k] = (data[off + k // 4] >> np.uint8(6 - 2 * (k & 3))) & np.uint8(3)
    else:
        first = 0
        if bits == 3:
            # whole groups of 8 indices = 3 bytes, read as one big-endian 24-bit word
            for grp in range(count // 8):
                pos = off + 3 * grp
                word = ((np.uint32(data[pos]) << np.uint32(16))
                        | (np.uint32(data[pos + 1]) << np.uint32(8)) | np.uint32(data[pos + 2]))
                for t in range(8):
                    idx[8 * grp + t] = np.uint8((word >> np.uint32(21 - 3 * t)) & np.uint32(7))
            first = count // 8 * 8
        mask = np.uint32((1 << bits) - 1)
        for k in range(first, count):
            bit = k * bits
            pos = off + bit // 8
            # a field spans at most two bytes; read the second only when it exists
            word = np.uint32(data[pos]) << np.uint32(8)
            if (bit & 7) + bits > 8:
                word |= np.uint32(data[pos + 1])
            idx[k] = np.uint8((word >> np.uint32(16 - bits - (bit & 7))) & mask)


@njit
def pack_bits(idx, bits):
    """Pack uint8 values below ``2^bits`` MSB first; returns ``ceil(n*bits/8)`` bytes."""
    out = np.zeros((idx.size * bits + 7) // 8, dtype=np.uint8)
    _pack_into(idx, idx.size, bits, out, 0)
    return out


@njit
def unpack_bits(data, bits, count):
    """Unpack ``count`` values of ``bits`` bits (``data`` holds ``ceil(count*bits/8)`` bytes)."""
    idx = np.empty(count, dtype=np.uint8)
    _unpack_from(data, 0, bits, count, idx)
    return idx


@njit(fastmath=True)
def sum_squares(x):
    """Σ x² in float64.

    fastmath lets LLVM split the sum over vector lanes; the order is fixed by
    the compiled code, so every call gives the same result for the same input.
    """
    acc = 0.0
    for i in range(x.size):
        v = np.float64(x[i])
        acc += v * v
    return acc


@njit
def encode_blocks(x, padded, block, factor, sign_seed, round_seed, xk, thr, bits, out):
    """Rotate, stochastically round and pack float32 ``x`` into ``out`` (``padded*bits/8`` bytes).

    ``factor`` maps rotated values to fine-grid units (``sqrt(n/block)/(max_norm*δ)``);
    the grid position is clamped to ``[0, S-1]`` (the clamp to ``[-T, T]``). Grid
    point ``j`` sends index ``xk[j] + 1`` when the high random word is below
    ``thr[j]``, else ``xk[j]``.
    """
    top = xk.size - 1
    half = np.float32(0.5 * top)
    ftop = np.float32(top)
    scratch = np.empty(block, dtype=np.float32)
    grid = np.empty(block, dtype=np.uint32)
    high = np.empty(block, dtype=np.uint32)
    idx = np.empty(block, dtype=np.uint8)
    for base in range(0, padded, block):
        _fill_signed(x, x.size, base, block, factor, sign_seed, scratch)
        fwht(scratch)
        # vectorisable pass: fine-grid stochastic rounding (float32 is exact enough here:
        # its rounding of v is below 1e-4 of a grid step)
        for k in range(block):
            v = min(max(scratch[k] + half, np.float32(0.0)), ftop)
            j = np.uint32(v)
            r = _mix(round_seed, base + k)
            up = np.float32(np.uint32(r & _LOW32)) < (v - np.float32(j)) * np.float32(_TWO32)
            grid[k] = min(j + np.uint32(up), np.uint32(top))
            high[k] = np.uint32(r >> np.uint64(32))
        # table lookups do not vectorise (no gathers): keep them in a lean scalar pass
        for k in range(block):
            j = grid[k]
            idx[k] = xk[j] + np.uint8(high[k] < thr[j])
        _pack_into(idx, block, bits, out, base * bits // 8)


@njit
def _read_lanes(data, width, bits, levels, start, count, idx, dst, accumulate):
    # dst[:count] (+)= lanes start..start+count-1 of data: packed indices mapped through
    # levels (width 0) or little-endian unsigned lanes of width bytes
    if width == 0:
        _unpack_from(data, start * bits // 8, bits, count, idx)
        for k in range(count):
            dst[k] = (dst[k] if accumulate else np.uint32(0)) + levels[idx[k]]
    elif width == 1:
        src = data[start:start + count]
        for k in range(count):
            dst[k] = (dst[k] if accumulate else np.uint32(0)) + np.uint32(src[k])
    elif width == 2:
        src = data[2 * start:2 * (start + count)]
        for k in range(count):
            lane = np.uint32(src[2 * k]) | (np.uint32(src[2 * k + 1]) << np.uint32(8))
            dst[k] = (dst[k] if accumulate else np.uint32(0)) + lane
    else:
        src = data[4 * start:4 * (start + count)]
        for k in range(count):
            lane = (np.uint32(src[4 * k]) | (np.uint32(src[4 * k + 1]) << np.uint32(8))
                    | (np.uint32(src[4 * k + 2]) << np.uint32(16))
                    | (np.uint32(src[4 * k + 3]) << np.uint32(24)))
            dst[k] = (dst[k] if accumulate else np.uint32(0)) + lane


@njit
def decode_blocks(data, width, bits, values, levels, offset, scale, n, block, sign_seed, out):
    """Inverse rotation of lane sums into ``out`` (``n`` float32).

    Packed indices (``width == 0``): index i stands for ``values[i]`` (already
    scaled). Lanes of ``width`` bytes: a lane sum S stands for
    ``(S - offset) * scale``.
    """
    padded = (n + block - 1) // block * block
    scratch = np.empty(block, dtype=np.float32)
    idx = np.empty(block, dtype=np.uint8)
    lanes = np.empty(block, dtype=np.uint32)
    for base in range(0, padded, block):
        if width == 0:
            _unpack_from(data, base * bits // 8, bits, block, idx)
            for k in range(block):
                scratch[k] = values[idx[k]]
        else:
            _read_lanes(data, width, bits, levels, base, block, idx, lanes, False)
            for k in range(block):
                scratch[k] = np.float32((np.float64(lanes[k]) - offset) * scale)
        fwht(scratch)
        _emit_signed(scratch, n, base, block, sign_seed, out)


@njit
def add_lanes(a, a_width, b, b_width, bits, levels, padded, out, out_width):
    """Write lanes ``a + b`` into ``out`` (``padded`` lanes of ``out_width`` bytes).

    ``a`` and ``b`` are packed indices (width 0, mapped through ``levels``)
    or little-endian lanes; the caller chose ``out_width`` wide enough.
    """
    chunk = 4096
    idx = np.empty(chunk, dtype=np.uint8)
    acc = np.empty(chunk, dtype=np.uint32)
    for start in range(0, padded, chunk):
        count = min(chunk, padded - start)
        _read_lanes(a, a_width, bits, levels, start, count, idx, acc, False)
        _read_lanes(b, b_width, bits, levels, start, count, idx, acc, True)
        for shift in range(out_width):
            dst = out[start * out_width + shift:(start + count) * out_width:out_width]
            for k in range(count):
                dst[k] = np.uint8((acc[k] >> np.uint32(8 * shift)) & np.uint32(0xFF))
