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
"""

import numpy as np

from .._jit import njit, prange

__all__ = ["fwht", "rotate", "encode_blocks", "decode_blocks", "accumulate", "pack_bits",
           "unpack_bits", "sum_squares"]

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_LOW32 = np.uint64(0xFFFFFFFF)
_TWO32 = 4294967296.0


@njit(inline="always")
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


@njit(inline="always")
def _flip_signs(bits, start, count, sign_seed):
    # negate bits[:count] (float32 bit patterns of elements start.. start+count-1) where the
    # rotation sign is -1: bit (i % 64) of word (i // 64) of the sign stream; start % 64 == 0
    for k0 in range(0, count, 64):
        word = _mix(sign_seed, (start + k0) >> 6)
        for k in range(k0, min(k0 + 64, count)):
            bits[k] ^= np.uint32((word >> np.uint64(k & 63)) << np.uint64(31))


@njit(inline="always")
def _fill_signed(x, n, base, block, factor, sign_seed, scratch):
    # scratch = xi * x[base:base+block] * factor, zero-padded past n
    m = max(min(block, n - base), 0)
    src = x[base:base + m]
    for k in range(m):
        scratch[k] = np.float32(src[k] * factor)
    for k in range(m, block):
        scratch[k] = np.float32(0.0)
    _flip_signs(scratch.view(np.uint32), base, m, sign_seed)


@njit(inline="always")
def _emit_signed(scratch, n, base, block, sign_seed, out):
    # out[base:base+block] = xi * scratch, truncated at n
    m = max(min(block, n - base), 0)
    _flip_signs(scratch.view(np.uint32), base, m, sign_seed)
    dst = out[base:base + m]
    for k in range(m):
        dst[k] = scratch[k]


@njit(parallel=True)
def rotate(x, padded, block, factor, sign_seed, inverse):
    """Blocked randomized Hadamard transform (tests and tools; the codec fuses it).

    Forward: ``y = H(xi * x) * factor`` over ``padded`` zero-padded elements.
    Inverse (``inverse=True``, ``x`` of ``padded`` elements):
    ``xi * H(x) * factor``, all ``padded`` elements. ``H`` is unnormalised;
    pass ``factor = 1/sqrt(block)`` for the orthonormal transform.
    """
    out = np.empty(padded, dtype=np.float32)
    for blk in prange(padded // block):
        base = blk * block
        scratch = np.empty(block, dtype=np.float32)
        if inverse:
            for k in range(block):
                scratch[k] = np.float32(x[base + k] * factor)
            fwht(scratch)
            _emit_signed(scratch, padded, base, block, sign_seed, out)
        else:
            _fill_signed(x, x.size, base, block, factor, sign_seed, scratch)
            fwht(scratch)
            for k in range(block):
                out[base + k] = scratch[k]
    return out


@njit(inline="always")
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
        acc = np.uint32(0)
        nacc = 0
        o = off
        for k in range(count):
            acc = (acc << np.uint32(bits)) | np.uint32(idx[k])
            nacc += bits
            if nacc >= 8:
                nacc -= 8
                out[o] = np.uint8((acc >> np.uint32(nacc)) & np.uint32(0xFF))
                o += 1
        if nacc > 0:
            out[o] = np.uint8((acc << np.uint32(8 - nacc)) & np.uint32(0xFF))


@njit(inline="always")
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
        mask = np.uint32((1 << bits) - 1)
        for k in range(count):
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
    """Unpack ``count`` values of ``bits`` bits (``data`` must hold ``ceil(count*bits/8)`` bytes)."""
    idx = np.empty(count, dtype=np.uint8)
    _unpack_from(data, 0, bits, count, idx)
    return idx


@njit(fastmath=True)
def _sum_squares_serial(x):
    # fastmath lets LLVM reorder the sum into vector lanes (the result is still deterministic)
    acc = 0.0
    for i in range(x.size):
        v = np.float64(x[i])
        acc += v * v
    return acc


@njit(parallel=True)
def sum_squares(x):
    """Σ x² in float64 (fixed chunking: the same result for any thread count)."""
    chunk = 1 << 16
    nchunks = (x.size + chunk - 1) // chunk
    partial = np.empty(nchunks, dtype=np.float64)
    for c in prange(nchunks):
        partial[c] = _sum_squares_serial(x[c * chunk:min((c + 1) * chunk, x.size)])
    return partial.sum()


@njit(parallel=True)
def encode_blocks(x, padded, block, factor, sign_seed, round_seed, xk, thr, bits, out):
    """Rotate, stochastically round and pack ``x`` into ``out`` (``padded*bits/8`` bytes).

    ``factor`` maps rotated values to fine-grid units (``sqrt(P/block)/(max_norm*δ)``);
    the grid position is clamped to ``[0, S-1]`` (the clamp to ``[-T, T]``). Grid
    point ``j`` sends index ``xk[j] + 1`` when the high random word is below
    ``thr[j]``, else ``xk[j]``.
    """
    top = xk.size - 1
    half = np.float32(0.5 * top)
    ftop = np.float32(top)
    for blk in prange(padded // block):
        base = blk * block
        scratch = np.empty(block, dtype=np.float32)
        grid = np.empty(block, dtype=np.uint32)
        high = np.empty(block, dtype=np.uint32)
        idx = np.empty(block, dtype=np.uint8)
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


@njit(parallel=True)
def decode_blocks(data, packed, bits, values, offset, scale, n, block, sign_seed, out):
    """Inverse rotation of lane sums into ``out`` (``n`` float32).

    Packed data (``packed=True``): value of index i is ``values[i]`` (already
    scaled). Lanes: value is ``(lane - offset) * scale``.
    """
    padded = (n + block - 1) // block * block
    for blk in prange(padded // block):
        base = blk * block
        scratch = np.empty(block, dtype=np.float32)
        if packed:
            idx = np.empty(block, dtype=np.uint8)
            _unpack_from(data, base * bits // 8, bits, block, idx)
            for k in range(block):
                scratch[k] = values[idx[k]]
        else:
            for k in range(block):
                scratch[k] = np.float32((np.float64(data[base + k]) - offset) * scale)
        fwht(scratch)
        _emit_signed(scratch, n, base, block, sign_seed, out)


@njit(parallel=True)
def accumulate(data, packed, bits, levels, padded, out):
    """``out += R[idx]`` (packed data) or ``out += lanes`` (integer lanes), ``padded`` lanes."""
    if packed:
        chunk = 4096
        for c in prange((padded + chunk - 1) // chunk):
            base = c * chunk
            count = min(chunk, padded - base)
            idx = np.empty(chunk, dtype=np.uint8)
            _unpack_from(data, base * bits // 8, bits, count, idx)
            for k in range(count):
                out[base + k] += levels[idx[k]]
    else:
        for i in prange(padded):
            out[i] += data[i]
