"""The ``dithering`` codec: unbiased stochastic rounding to ``s`` levels (QSGD-style).

Each value is divided by a per-chunk scale (``max|x|`` or ``||x||_2``), so
``r = |x| / scale`` lies in ``[0, 1]``, and ``r`` is rounded at random to one of
its two neighbouring levels with the probabilities that make the rounding
unbiased: ``E[decode(encode(x))] = x``. Two level sets ("partitions"):

* ``linear``: levels ``j / s`` for ``j = 0..s`` (QSGD);
* ``natural``: level 0 is ``0`` and level ``j`` is ``2^(j - s)`` for
  ``j = 1..s``, i.e. ``{0, 2^(1-s), ..., 1/2, 1}`` (natural compression's
  powers of two; relative error at most 2x for any value above
  ``2^(1-s) * scale``).

Randomness is per rank (``ctx.seed(seed, per_rank=True)``): the rounding of
element ``i`` compares the high 32 bits of SplitMix64 output ``i`` with the
probability, so it is reproducible, needs no state, and vectorises.

Body layout (little-endian, after the 32-byte header)::

    offset 0   float32  scale (finite, >= 0; rounded up from the exact statistic)
    offset 4   n codes sign * j: int8 when s <= 127, int16 (2 bytes each) when
               s >= 128; every |code| <= s
"""

import math
import struct

import numpy as np

from ..._jit import njit, prange
from ...errors import PayloadError
from .._shared_kernels import f32_round_up, sized_kernel, stream64
from ..base import Codec
from ..header import FLAG_OVERFLOW
from ..registry import register_codec

__all__ = ["DitheringCodec"]

_SCALE = struct.Struct("<f")
_BLOCK = 1 << 15  # values per parallel block of the reductions
_TWO32 = 4294967296.0
_MASK32 = np.uint64(0xFFFFFFFF)
_MANT = np.uint64((1 << 52) - 1)


@sized_kernel()
def _abs_max(x, partial):
    """max|x| by fixed blocks; eight running maxima keep the loop free of a serial chain."""
    n = x.size
    for b in prange(partial.size):
        start = b * _BLOCK
        stop = min(start + _BLOCK, n)
        m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = abs(np.float64(x[start]))
        i = start
        while i + 8 <= stop:
            m0 = max(m0, abs(np.float64(x[i])))
            m1 = max(m1, abs(np.float64(x[i + 1])))
            m2 = max(m2, abs(np.float64(x[i + 2])))
            m3 = max(m3, abs(np.float64(x[i + 3])))
            m4 = max(m4, abs(np.float64(x[i + 4])))
            m5 = max(m5, abs(np.float64(x[i + 5])))
            m6 = max(m6, abs(np.float64(x[i + 6])))
            m7 = max(m7, abs(np.float64(x[i + 7])))
            i += 8
        while i < stop:
            m0 = max(m0, abs(np.float64(x[i])))
            i += 1
        partial[b] = max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
    return partial.max()


@sized_kernel()
def _sum_squares(x, partial):
    """sum x**2 in float64, by fixed blocks added in order (independent of the thread count)."""
    n = x.size
    for b in prange(partial.size):
        a0 = a1 = a2 = a3 = 0.0
        start = b * _BLOCK
        stop = min(start + _BLOCK, n)
        i = start
        while i + 4 <= stop:
            v0, v1, v2, v3 = np.float64(x[i]), np.float64(x[i + 1]), np.float64(x[i + 2]), \
                np.float64(x[i + 3])
            a0 += v0 * v0
            a1 += v1 * v1
            a2 += v2 * v2
            a3 += v3 * v3
            i += 4
        while i < stop:
            v = np.float64(x[i])
            a0 += v * v
            i += 1
        partial[b] = (a0 + a1) + (a2 + a3)
    total = 0.0
    for b in range(partial.size):
        total += partial[b]
    return total


@njit
def _uniform32(seed, i):
    # 32 random bits for element i, as a float64 in [0, 2^32)
    return np.float64(stream64(seed, i) >> np.uint64(32))


@sized_kernel()
def _dither_linear(x, factor, s, seed, out):
    """Round ``|x| * factor`` (``factor = s / scale``) stochastically to an integer in ``0..s``.

    ``t`` goes up to ``floor(t) + 1`` with probability ``t - floor(t)``, so the
    expected code is ``t``: unbiased.
    """
    top = np.float64(s)
    for i in prange(x.size):
        v = x[i]
        t = min(abs(np.float64(v)) * factor, top)
        low = math.floor(t)
        q = np.int32(low) + np.int32(_uniform32(seed, i) < (t - low) * _TWO32)
        out[i] = -q if v < 0 else q


@njit
def _natural_level(r, s, c_low):
    """``(j, p)``: ``r`` lies between level ``j`` and ``j + 1``; ``p`` is the chance of going up.

    For ``r`` in ``[2^(j-s), 2^(j-s+1))`` with ``j >= 1`` the gap equals the lower
    level, so ``p = r / 2^(j-s) - 1``, the mantissa's fraction; below level 1
    (``j = 0``, between 0 and ``2^(1-s)``) ``p = r * 2^(s-1)``. ``c_low`` is
    ``2^(s-1)`` when ``s <= 1000``, else 0, which selects the exact path for
    exponents a float64 cannot scale in one multiply.
    """
    if c_low == 0.0:
        if r == 0.0:
            return 0, 0.0
        mant, e2 = math.frexp(r)  # r = mant * 2^e2, mant in [0.5, 1)
        j = e2 - 1 + s
        if j >= 1:
            return j, 2.0 * mant - 1.0
        return 0, math.ldexp(r, s - 1)
    # r = 0 and subnormal r land in the second branch (j < 1), where r * c_low is exact
    bits = np.float64(r).view(np.uint64)
    j = np.int64(bits >> np.uint64(52)) - 1023 + s
    if j >= 1:
        return j, np.float64(bits & _MANT) * (1.0 / 4503599627370496.0)  # mantissa / 2^52
    return 0, r * c_low


@sized_kernel()
def _dither_natural(x, inv_scale, s, c_low, seed, out):
    """Round ``|x| * inv_scale`` stochastically to a neighbouring power-of-two level index."""
    for i in prange(x.size):
        v = x[i]
        j, p = _natural_level(min(abs(np.float64(v)) * inv_scale, 1.0), s, c_low)
        q = np.int32(j) + np.int32(_uniform32(seed, i) < p * _TWO32)
        out[i] = -q if v < 0 else q


@sized_kernel()
def _dequantize_linear(codes, step, out):
    """``out = codes * step``; return the largest ``|code|`` for the range check."""
    worst = 0
    for i in prange(codes.size):
        c = np.int32(codes[i])
        worst = max(worst, abs(c))
        out[i] = np.float32(np.float64(c) * step)
    return worst


@sized_kernel()
def _lookup(codes, table, s, out):
    """``out[i] = table[codes[i] + s]``; return the largest ``|code|`` for the range check.

    Codes outside ``[-s, s]`` read a clamped entry, never outside ``table``.
    """
    worst = 0
    for i in prange(codes.size):
        c = np.int32(codes[i])
        worst = max(worst, abs(c))
        out[i] = table[min(max(c + s, 0), 2 * s)]
    return worst


@register_codec
class DitheringCodec(Codec):
    """Unbiased stochastic rounding to ``levels`` magnitudes per sign, 8 or 16 bits per value.

    Parameters
    ----------
    levels : int
        Number of nonzero magnitudes ``s``, 1..32767. Codes are int8 for
        ``s <= 127`` and int16 for ``s >= 128``. More levels, less variance.
    partition : {"linear", "natural"}
        ``linear``: levels ``j / s`` (QSGD). ``natural``: ``0`` and
        ``2^(j - s)`` for ``j = 1..s`` (powers of two, small relative error
        over a wide range; a few levels cover many orders of magnitude).
    norm : {"max", "l2"}
        The per-chunk scale: ``max|x|`` (default; smallest error) or
        ``||x||_2`` (QSGD's choice; coarser, and with error feedback it can
        diverge, as the BytePS documentation warns).
    seed : int
        Base seed (``>= 0``) of the per-rank rounding randomness.

    Notes
    -----
    Unbiased, so usable without error feedback; the collectives still keep
    residuals at every lossy point by default. Not homomorphic (per-rank
    scales): use the ``direct`` collective. A chunk whose scale is zero
    decodes to zeros.

    Examples
    --------
    >>> import numpy as np
    >>> from ccl.codecs import get_codec
    >>> codec = get_codec("dithering", levels=127)
    >>> x = np.linspace(-1, 1, 1000, dtype=np.float32)
    >>> payload = codec.encode(x)
    >>> payload.size < x.nbytes / 3      # 8 bits per value
    True
    >>> bool(np.abs(codec.decode(payload) - x).max() <= 1 / 127 + 1e-6)
    True
    """

    codec_id = "dithering"
    wire_id = 11
    device_twin = "ccl.codecs.dithering._cuda:DitheringTwin"  # see ccl.codecs.device
    homomorphic = False
    error_feedback = True
    encode_gbps, decode_gbps = 2.85, 7.10

    @property
    def bits_per_value(self):
        """Expected payload bits per value: one int8 (int16 above 127 levels) lane each."""
        return 8.0 if self.levels <= 127 else 16.0

    def __init__(self, levels=127, partition="linear", norm="max", seed=0):
        if isinstance(levels, bool) or not isinstance(levels, (int, np.integer)) \
                or not 1 <= levels <= 32767:
            raise ValueError(f"dithering: levels must be an int in 1..32767, got {levels!r}")
        if partition not in ("linear", "natural"):
            raise ValueError(f"dithering: partition must be 'linear' or 'natural', "
                             f"got {partition!r}")
        if norm not in ("max", "l2"):
            raise ValueError(f"dithering: norm must be 'max' or 'l2', got {norm!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"dithering: seed must be an int >= 0, got {seed!r}")
        self.levels = int(levels)
        self.partition = str(partition)
        self.norm = str(norm)
        self.seed = int(seed)

    def check_error_feedback(self):
        """Refuse ``norm="l2"`` with error feedback: its residual need not shrink.

        Raises
        ------
        ValueError
            If ``norm`` is ``"l2"``. The rounding error of an element is up to
            one level step, ``||p||_2 / s``, so the residual's norm can reach
            ``sqrt(n) / s`` times the input's: with fewer levels than
            ``sqrt(n)`` the residual grows step after step.
        """
        if self.norm == "l2":
            raise ValueError(
                "dithering: norm='l2' with error feedback (a call with key=) can diverge: "
                "each value may be rounded by ||x||_2/levels, so the residual outgrows the "
                "input when levels < sqrt(n). Use norm='max' (its residual stays below "
                "max|x|/levels per value) with key=, or norm='l2' without key= (unbiased, "
                "no residual)")

    @property
    def code_dtype(self):
        """int8 when ``levels <= 127``, else int16."""
        return np.dtype(np.int8) if self.levels <= 127 else np.dtype(np.int16)

    def level_values(self):
        """The ``levels + 1`` magnitudes (fractions of the scale), level 0 first.

        Returns
        -------
        numpy.ndarray
            float64 array of ``levels + 1`` values from 0 to 1.
        """
        s = self.levels
        j = np.arange(s + 1, dtype=np.float64)
        if self.partition == "linear":
            return j / s
        out = np.ldexp(1.0, (j - s).astype(np.int64))
        out[0] = 0.0
        return out

    def _statistic(self, x):
        nblocks = (x.size + _BLOCK - 1) // _BLOCK
        if self.norm == "l2":
            return math.sqrt(_sum_squares(x, np.empty(nblocks, np.float64)))
        return float(_abs_max(x, np.empty(nblocks, np.float64)))

    def _encode(self, x, ctx):
        n = x.size
        width = self.code_dtype.itemsize
        body = np.zeros(_SCALE.size + n * width, dtype=np.uint8)
        scale = f32_round_up(self._statistic(x)) if n else 0.0
        if scale is None:
            return np.empty(0, np.uint8), FLAG_OVERFLOW
        body[:_SCALE.size] = np.frombuffer(_SCALE.pack(scale), dtype=np.uint8)
        if scale > 0.0:
            codes = body[_SCALE.size:].view(self.code_dtype)
            seed = np.uint64(ctx.seed(self.seed, per_rank=True))
            s = self.levels
            if self.partition == "linear":
                _dither_linear(x, s / scale, s, seed, codes)
            else:
                c_low = math.ldexp(1.0, s - 1) if s <= 1000 else 0.0
                _dither_natural(x, 1.0 / scale, s, c_low, seed, codes)
        return body, 0

    def _parse(self, header, body):
        """Validate a body (host or device array); return the scale."""
        n = header.n
        width = self.code_dtype.itemsize
        if body.size != _SCALE.size + n * width:
            raise PayloadError(f"dithering: body of {body.size} bytes cannot hold {n} codes of "
                               f"{width} bytes (expected {_SCALE.size + n * width})")
        (scale,) = _SCALE.unpack(body[:_SCALE.size].tobytes())
        if not np.isfinite(scale) or scale < 0:
            raise PayloadError(f"dithering: invalid scale {scale!r}")
        return scale

    def _decode(self, header, body, ctx):
        n = header.n
        scale = self._parse(header, body)
        s = self.levels
        out = np.empty(n, dtype=np.float32)
        if not n:
            return out
        codes = body[_SCALE.size:].view(self.code_dtype)
        if self.partition == "linear":
            worst = _dequantize_linear(codes, scale / s, out)
        else:
            worst = _lookup(codes, self._table(scale), s, out)
        if worst > s:
            raise PayloadError(f"dithering: codes outside -{s}..{s}")
        return out

    def _table(self, scale):
        """float32 values of the codes ``-s..s`` of the natural partition."""
        magnitudes = (scale * self.level_values()).astype(np.float32)
        return np.concatenate([-magnitudes[:0:-1], magnitudes])
