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

from __future__ import annotations

import math
import struct

import numpy as np

from ...errors import PayloadError
from .._shared_kernels import f32_round_up
from ..base import Codec
from ..header import FLAG_OVERFLOW
from ..registry import register_codec
from ._kernels import (BLOCK, abs_max, dequantize_linear, dither_linear, dither_natural, lookup,
                       sum_squares)

__all__ = ["DitheringCodec"]

_SCALE = struct.Struct("<f")
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

    def __init__(self, levels: int = 127, partition: str = "linear", norm: str = "max",
                 seed: int = 0) -> None:
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
        nblocks = (x.size + BLOCK - 1) // BLOCK
        if self.norm == "l2":
            return math.sqrt(sum_squares(x, np.empty(nblocks, np.float64)))
        return float(abs_max(x, np.empty(nblocks, np.float64)))

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
                dither_linear(x, s / scale, s, seed, codes)
            else:
                c_low = math.ldexp(1.0, s - 1) if s <= 1000 else 0.0
                dither_natural(x, 1.0 / scale, s, c_low, seed, codes)
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
            worst = dequantize_linear(codes, scale / s, out)
        else:
            worst = lookup(codes, self._table(scale), s, out)
        if worst > s:
            raise PayloadError(f"dithering: codes outside -{s}..{s}")
        return out

    def _table(self, scale):
        """float32 values of the codes ``-s..s`` of the natural partition."""
        magnitudes = (scale * self.level_values()).astype(np.float32)
        return np.concatenate([-magnitudes[:0:-1], magnitudes])
