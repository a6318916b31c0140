"""numba.cuda kernels of every codec (imported only when a device array is encoded).

Each kernel is the device twin of a CPU kernel and writes the same bytes:
the payloads of the two paths are interchangeable (codec-specs.md), and
bit-identical wherever the codec is deterministic. Three rules keep them so:

* every element is computed by the same scalar formula, in the same
  precision; scalar helpers are the CPU kernels' own Python functions
  (``py_func``) compiled for the device, with the helpers they call
  rebound to their device twins;
* reductions whose float result reaches the payload (onebit's ``sum|x|``,
  dithering's ``sum x**2``) reproduce the CPU kernel's summation order
  exactly: one thread per (block, accumulator) of the CPU loop, the few
  partial sums combined on the host in the CPU's order;
* mixed float32/float64 arithmetic is written out as float64 (the simulator
  would otherwise compute it in float32, numpy's rule for Python scalars);
* no ``a * b + c`` is left to the compiler where it could be contracted
  into a fused multiply-add (NVVM contracts by default): the one such sum
  multiplies with ``dmul_rn``, which is never fused.

Kernels use grid-stride loops, so any launch shape is correct: under the
CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) they launch 2 blocks of 8
threads, which keeps the simulator fast and still crosses block boundaries.
"""

import math
import types

import numba
import numpy as np
from numba import cuda

from . import _shared_kernels as _S
from . import _threelc_kernels as _T
from .onebit import _bit as _cpu_bit

SIMULATOR = bool(numba.config.ENABLE_CUDASIM)
_THREADS = 8 if SIMULATOR else 256
_MAX_BLOCKS = 2 if SIMULATOR else 65535


def launch(kernel, n, stream, *args):
    """Launch ``kernel`` with enough threads for ``n`` work items (grid-stride inside)."""
    blocks = max(1, min(_MAX_BLOCKS, (int(n) + _THREADS - 1) // _THREADS))
    kernel[blocks, _THREADS, stream](*args)


def _device(func):
    return cuda.jit(device=True)(func)


# ----------------------------------------------------------------- scalar helpers
mix64 = _device(_S.mix64.py_func)
_mulhi64 = _device(_S._mulhi64.py_func)
_digit = _device(_T._digit.py_func)
_bit = _device(_cpu_bit.py_func)

_LOW32 = np.uint64(0xFFFFFFFF)
_TWO32 = 4294967296.0

if SIMULATOR:
    @_device
    def _mul_rn(a, b):
        return a * b
else:  # pragma: no cover - needs a GPU
    from numba.cuda import libdevice

    _mul_rn = libdevice.dmul_rn


def _twin(func, **rebind):
    """Compile a CPU kernel's Python function for the device, its callees rebound to twins."""
    py = func.py_func
    scope = dict(py.__globals__, **rebind)
    return _device(types.FunctionType(py.__code__, scope, py.__name__, py.__defaults__,
                                      py.__closure__))


stream64 = _twin(_S.stream64, mix64=mix64)
uniform_below = _twin(_S.uniform_below, stream64=stream64, _mulhi64=_mulhi64)


# ----------------------------------------------------------------- casts
@cuda.jit
def fp16_encode(x, bits, out, flag):
    """float32 -> IEEE half bits, round to nearest even (``casts._to_fp16``); flag overflow.

    ``bits`` is ``x`` viewed as uint32. Subnormal halves: adding 0.5 puts
    the 2^-24 unit at the last mantissa bit, so the FPU rounds to even
    exactly as ``rint(|x| * 2^24)`` does.
    """
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        u = bits[i]
        a = u & np.uint32(0x7FFFFFFF)
        normal = ((a + np.uint32(0xFFF) + ((a >> np.uint32(13)) & np.uint32(1)))
                  >> np.uint32(13)) - np.uint32(0x1C000)
        shifted = abs(x[i]) + np.float32(0.5)
        subnormal = np.uint32(shifted * np.float32(16777216.0)) - np.uint32(8388608)
        half = subnormal if a < np.uint32(0x38800000) else normal
        if a >= np.uint32(0x477FF000):
            half = np.uint32(0x7C00)
            cuda.atomic.max(flag, 0, 1)
        out[i] = np.uint16(((u >> np.uint32(16)) & np.uint32(0x8000)) | half)


@cuda.jit
def fp16_decode(halves, out_bits):
    """IEEE half bits -> float32 bits (exact, NaN payloads kept, as numpy's cast)."""
    for i in range(cuda.grid(1), halves.size, cuda.gridsize(1)):
        h = np.uint32(halves[i])
        sign = (h & np.uint32(0x8000)) << np.uint32(16)
        e = (h >> np.uint32(10)) & np.uint32(0x1F)
        m = h & np.uint32(0x3FF)
        if e == np.uint32(0x1F):
            out_bits[i] = sign | np.uint32(0x7F800000) | (m << np.uint32(13))
        elif e != np.uint32(0):
            out_bits[i] = sign | ((e + np.uint32(112)) << np.uint32(23)) | (m << np.uint32(13))
        elif m == np.uint32(0):
            out_bits[i] = sign
        else:
            # subnormal half: normalise the mantissa into a float32 normal
            exp = np.uint32(113)
            while (m & np.uint32(0x400)) == np.uint32(0):
                m = m << np.uint32(1)
                exp -= np.uint32(1)
            out_bits[i] = sign | (exp << np.uint32(23)) | ((m & np.uint32(0x3FF)) << np.uint32(13))


@cuda.jit
def bf16_encode(bits, out, flag):
    """float32 bits -> bfloat16, round to nearest even (``casts._to_bf16``); flag overflow."""
    for i in range(cuda.grid(1), bits.size, cuda.gridsize(1)):
        u = bits[i]
        rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        out[i] = np.uint16(rounded)
        if (rounded & np.uint32(0x7F80)) == np.uint32(0x7F80):
            cuda.atomic.max(flag, 0, 1)


# ----------------------------------------------------------------- onebit
@cuda.jit
def onebit_partial(x, full, block_bytes, partial):
    """``partial[8*b + t]`` = sum |x[8j + t]| over the bytes j of CPU block b (in order)."""
    for w in range(cuda.grid(1), partial.size, cuda.gridsize(1)):
        b = w // 8
        t = w % 8
        start = b * block_bytes
        stop = min(start + block_bytes, full)
        acc = np.float64(0.0)  # explicit: the simulator would keep a float32 sum in float32
        for j in range(start, stop):
            acc += np.float64(abs(x[8 * j + t]))
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


# ----------------------------------------------------------------- 3LC
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
        if b != _T.ZERO_BYTE:
            out[o] = b
        else:
            r = runs[i]  # the run's length at its first byte, 0 inside a run
            while r >= _T.MAX_RUN:
                out[o] = 255
                o += 1
                r -= _T.MAX_RUN
            if r == 1:
                out[o] = _T.ZERO_BYTE
            elif r >= 2:
                out[o] = np.uint8(_T.RUN_BASE + r)


@cuda.jit
def zre_expand(z, offsets, out):
    """Zero-run decode: code p expands at ``offsets[p]`` (lengths checked by the caller)."""
    for p in range(cuda.grid(1), z.size, cuda.gridsize(1)):
        b = z[p]
        o = offsets[p]
        if b <= _T.MAX_DIGIT_BYTE:
            out[o] = b
        else:
            for j in range(o, o + np.int64(b) - _T.RUN_BASE):
                out[j] = _T.ZERO_BYTE


@cuda.jit
def threelc_unfold(a, M, y, err):
    """Unfold quartic bytes into ``M * (digit - 1)``; ``err`` bit 0: bad pad, bit 1: M=0 data."""
    n = y.size
    L = a.size
    for i in range(cuda.grid(1), L, cuda.gridsize(1)):
        b = np.int32(a[i])
        if M == 0 and b != _T.ZERO_BYTE:
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


# ----------------------------------------------------------------- THC
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
        up = np.float32(np.uint32(r & _LOW32)) < (v - np.float32(j)) * np.float32(_TWO32)
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


# ----------------------------------------------------------------- randomk
@cuda.jit
def floyd_draws(seed, first, t, seen):
    """Draw c of Floyd's algorithm, ``t[c]`` uniform in ``[0, first + c]``; ``seen`` its first draw.

    Floyd's pick at step c is ``t[c]`` unless ``t[c]`` is already taken, in
    which case it is ``j = first + c``. Which draws were taken is decided by
    :func:`floyd_fallbacks` from these draws alone, in parallel.
    """
    for c in range(cuda.grid(1), t.size, cuda.gridsize(1)):
        draw = uniform_below(seed, c, np.uint64(first + c) + np.uint64(1))
        t[c] = np.int64(draw)
        cuda.atomic.min(seen, draw, np.uint32(c))


@cuda.jit
def floyd_mark(t, seen, first, mask):
    """Mark Floyd's picks in ``mask`` (one byte per candidate).

    Every draw ends up in the set. Step c also adds ``j_c = first + c``
    ("falls back") when ``t[c]`` was taken before step c: drawn by an earlier
    step, or equal to ``j_c'`` of an earlier step c' that fell back. That
    recursion runs down the chain c -> t[c] - first, which strictly decreases.
    """
    for c in range(cuda.grid(1), t.size, cuda.gridsize(1)):
        mask[t[c]] = 1
        cur = c
        while True:
            v = t[cur]
            if seen[v] < np.uint32(cur):  # drawn by an earlier step
                mask[first + c] = 1
                break
            prev = v - first
            if prev < 0 or prev >= cur:  # below the j range, or t == j itself
                break
            cur = prev


@cuda.jit
def gather(x, idx, factor, scaled, out):
    """``out[i] = x[idx[i]]`` (times ``factor`` when scaled) in float32."""
    for i in range(cuda.grid(1), idx.size, cuda.gridsize(1)):
        if scaled:
            out[i] = np.float64(x[idx[i]]) * factor  # float64 product, as numba types it
        else:
            out[i] = x[idx[i]]


@cuda.jit
def scatter(values, idx, out):
    """``out[idx[i]] = values[i]``."""
    for i in range(cuda.grid(1), idx.size, cuda.gridsize(1)):
        out[idx[i]] = values[i]


# ----------------------------------------------------------------- dithering
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
            acc += _mul_rn(v, v)
        if t == 0:
            for i in range(start + 4 * groups, stop):
                v = np.float64(x[i])
                acc += _mul_rn(v, v)
        partial[w] = acc


@cuda.jit
def dither_linear(x, factor, s, seed, out):
    """Stochastic rounding of ``|x| * factor`` to 0..s (``dithering._dither_linear``)."""
    top = np.float64(s)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        v = x[i]
        t = min(abs(np.float64(v)) * factor, top)
        low = math.floor(t)
        u = np.float64(stream64(seed, i) >> np.uint64(32))
        q = np.int32(low) + np.int32(u < (t - low) * _TWO32)
        out[i] = -q if v < 0 else q


@cuda.jit
def dither_natural(x, inv_scale, s, seed, out):
    """Stochastic rounding to power-of-two levels (``dithering._dither_natural``).

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
        q = np.int32(j) + np.int32(u < p * _TWO32)
        out[i] = -q if v < 0 else q


# ----------------------------------------------------------------- sparse
@cuda.jit
def pack_gaps(idx, w, out):
    """Word o of the LSB-first stream of ``w``-bit gaps ``idx[j] - idx[j-1] - 1``."""
    k = idx.size
    for o in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        word = np.uint64(0)
        lo = 32 * o
        j = lo // w
        while j < k and j * w < lo + 32:
            prev = idx[j - 1] if j > 0 else np.int64(-1)
            gap = np.uint64(idx[j] - prev - 1)
            at = j * w - lo  # bit of the word where gap j starts (may be negative)
            if at >= 0:
                word |= gap << np.uint64(at)
            else:
                word |= gap >> np.uint64(-at)
            j += 1
        out[o] = np.uint32(word & _LOW32)


@cuda.jit
def unpack_gaps(words, w, gaps):
    """``gaps[j]`` = bits ``j*w .. j*w + w - 1`` of the LSB-first word stream, plus one."""
    mask = (np.uint64(1) << np.uint64(w)) - np.uint64(1)
    for j in range(cuda.grid(1), gaps.size, cuda.gridsize(1)):
        g = j * w
        o = g // 32
        at = np.uint64(g % 32)
        acc = np.uint64(words[o]) >> at
        if o + 1 < words.size:
            acc |= np.uint64(words[o + 1]) << (np.uint64(32) - at)
        gaps[j] = np.int64(acc & mask) + 1


@cuda.jit
def check_absolute(idx, n, first_error):
    """Smallest ``4*j + c`` over bad indices j: c=0 not ascending, c=1 out of range."""
    for j in range(cuda.grid(1), idx.size, cuda.gridsize(1)):
        i = np.int64(idx[j])
        if j > 0 and i <= np.int64(idx[j - 1]):
            cuda.atomic.min(first_error, 0, np.int64(4 * j))
        elif i >= n:
            cuda.atomic.min(first_error, 0, np.int64(4 * j + 1))
