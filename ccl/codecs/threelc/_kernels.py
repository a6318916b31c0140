"""numba kernels of the 3LC codec: max-abs, fused quantize + quartic fold, zero-run coding.

The quartic layout is the wire format's (``docs/codecs/3lc.md``): with
``L = ceil(n/5)``, byte ``i`` packs element ``i`` of each of five equal
contiguous partitions ``P_k = t[k*L:(k+1)*L]`` (``t = q + 1``, padded with
digit 1), as ``81*P_0[i] + 27*P_1[i] + 9*P_2[i] + 3*P_3[i] + P_4[i]``.

Decoding kernels run after the Python side has validated every length, but
they still bound every write by the sizes they were given and report a
malformed stream with a non-zero return code instead of writing past it.
"""

import numpy as np

from ..._jit import njit, prange
from .._shared_kernels import masked_max, sized_kernel

ZERO_BYTE = 121     # five zero digits: 81 + 27 + 9 + 3 + 1
RUN_BASE = 241      # a byte b in 243..255 is a run of b - 241 zero bytes
MAX_RUN = 14        # byte 255
MAX_DIGIT_BYTE = 242

# return codes of the decoding kernels
OK = 0
ERR_OVERFLOW = 1    # the stream expands past L bytes
ERR_SHORT = 2       # the stream expands to fewer than L bytes
ERR_PAD = 3         # a pad digit (past n elements) is not 1
ERR_NONZERO = 4     # M = 0 but a byte is not "five zeros"

_BLOCK = 1 << 16    # elements (or quartic bytes) per parallel block


@sized_kernel(0)
def max_abs_bits(bits, mask):
    """Largest ``bits[i] & mask`` (the bit pattern of max |x| for finite floats).

    For finite IEEE values with the sign bit cleared, unsigned integer order
    equals the order of the magnitudes, and the integer max vectorises where
    a float max (with its NaN rules) does not.
    """
    nblocks = (bits.size + _BLOCK - 1) // _BLOCK
    partial = np.zeros(nblocks, dtype=bits.dtype)
    for b in prange(nblocks):
        lo = b * _BLOCK
        partial[b] = masked_max(bits[lo:min(lo + _BLOCK, bits.size)], mask)
    best = bits.dtype.type(0)
    for b in range(nblocks):
        if partial[b] > best:
            best = partial[b]
    return best


@njit(inline="always")
def _digit(v, M):
    # round_half_even(v / M) for |v| <= 1.5 M, as a digit 0/1/2: 2v is exact in
    # binary floating point, so comparing 2|v| with M decides ties exactly
    # (a tie 2|v| == M rounds to the even value 0).
    w = v + v
    return np.int32(1) + np.int32(w > M) - np.int32(w < -M)


@njit
def _fold_block(x0, x1, x2, x3, x4, M, out):
    # Zero-based loops over slices vectorise; see masked_max.
    for i in range(out.size):
        a = (((_digit(x0[i], M) * 3 + _digit(x1[i], M)) * 3 + _digit(x2[i], M)) * 3
             + _digit(x3[i], M)) * 3 + _digit(x4[i], M)
        out[i] = np.uint8(a)


@sized_kernel(0)
def quantize_fold(x, M, L, out):
    """Quantize ``x`` with scale ``M`` to {-1,0,1} and fold into ``L`` quartic bytes.

    Parameters
    ----------
    x : 1-D float32 or float64 array of n elements, ``ceil(n/5) == L``.
    M : positive scale of x's dtype.
    L : number of bytes to write.
    out : uint8 array of at least ``L`` bytes.
    """
    n = x.size
    # bytes [0, full) have all five partition elements inside x; at most 4 do not
    full = min(L, max(0, n - 4 * L))
    for b in prange((full + _BLOCK - 1) // _BLOCK):
        lo = b * _BLOCK
        hi = min(lo + _BLOCK, full)
        _fold_block(x[lo:hi], x[L + lo:L + hi], x[2 * L + lo:2 * L + hi],
                    x[3 * L + lo:3 * L + hi], x[4 * L + lo:4 * L + hi], M, out[lo:hi])
    for i in range(full, L):
        a = np.int32(0)
        for k in range(5):
            j = k * L + i
            a = 3 * a + (_digit(x[j], M) if j < n else np.int32(1))
        out[i] = np.uint8(a)


@njit
def zre_encode(a, out):
    """Zero-run encode the quartic bytes ``a`` into ``out``; return the length written.

    ``out`` needs ``a.size`` bytes: the code never expands (a run of one 121
    stays one byte, a run of 2..14 becomes one byte). ``out`` may be ``a``
    itself: every byte is written at or before the position already read.
    """
    L = a.size
    o = 0
    i = 0
    while i < L:
        b = a[i]
        if b != ZERO_BYTE:
            out[o] = b
            o += 1
            i += 1
            continue
        j = i + 1
        while j < L and a[j] == ZERO_BYTE:
            j += 1
        r = j - i
        i = j
        while r >= MAX_RUN:
            out[o] = 255
            o += 1
            r -= MAX_RUN
        if r == 1:
            out[o] = ZERO_BYTE
            o += 1
        elif r >= 2:
            out[o] = np.uint8(RUN_BASE + r)
            o += 1
    return o


@njit
def zre_decode(z, out):
    """Expand the zero-run coded ``z`` into exactly ``out.size`` quartic bytes.

    Returns ``OK``, ``ERR_OVERFLOW`` if the stream would write past
    ``out.size`` (nothing is written out of bounds), or ``ERR_SHORT`` if it
    ends early.
    """
    L = out.size
    o = 0
    for p in range(z.size):
        b = z[p]
        if b <= MAX_DIGIT_BYTE:
            if o >= L:
                return ERR_OVERFLOW
            out[o] = b
            o += 1
        else:
            r = np.intp(b) - RUN_BASE
            if o + r > L:
                return ERR_OVERFLOW
            for j in range(o, o + r):
                out[j] = ZERO_BYTE
            o += r
    return OK if o == L else ERR_SHORT


@njit
def _unfold_block(a, M, y0, y1, y2, y3, y4):
    # Arithmetic rather than a table lookup: gathers do not vectorise.
    # M * (d - 1) is exactly -M, +0.0 or M.
    one = np.int32(1)
    for i in range(a.size):
        b = np.int32(a[i])
        y0[i] = M * np.float32(b // 81 - one)
        y1[i] = M * np.float32((b // 27) % 3 - one)
        y2[i] = M * np.float32((b // 9) % 3 - one)
        y3[i] = M * np.float32((b // 3) % 3 - one)
        y4[i] = M * np.float32(b % 3 - one)


@sized_kernel(2)
def unfold(a, M, y):
    """Unfold quartic bytes ``a`` (``L`` of them) into ``y.size`` values ``M * (digit - 1)``.

    Returns ``ERR_PAD`` if a pad digit (element index >= ``y.size``) is not 1,
    ``ERR_NONZERO`` if ``M == 0`` and a digit is not 1, else ``OK``. Bytes
    must be <= 242 (``zre_decode`` output and validated streams are).
    """
    n = y.size
    L = a.size
    full = min(L, max(0, n - 4 * L))
    lut = np.empty(3, dtype=y.dtype)
    lut[0] = -M
    lut[1] = 0
    lut[2] = M
    for b in prange((full + _BLOCK - 1) // _BLOCK):
        lo = b * _BLOCK
        hi = min(lo + _BLOCK, full)
        _unfold_block(a[lo:hi], M, y[lo:hi], y[L + lo:L + hi], y[2 * L + lo:2 * L + hi],
                      y[3 * L + lo:3 * L + hi], y[4 * L + lo:4 * L + hi])
    code = OK
    for i in range(full, L):
        b = np.intp(a[i])
        for k in range(5):
            d = (b // 3 ** (4 - k)) % 3
            j = k * L + i
            if j < n:
                y[j] = lut[d]
            elif d != 1:
                code = ERR_PAD
    if M == 0 and code == OK:
        for i in range(L):
            if a[i] != ZERO_BYTE:
                return ERR_NONZERO
    return code
