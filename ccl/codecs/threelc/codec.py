"""3LC: three-value quantization, quartic encoding and zero-run encoding.

After Lim, Andersen and Kaminsky (MLSys 2019); ``docs/codecs/3lc.md`` gives
ccl's wire format and its exact rounding rules.

Each chunk is scaled by ``M = max|x| * s`` (a float32 on the wire), rounded
half to even to {-1, 0, +1}, packed five ternary digits per byte
("quartic" encoding, five equal contiguous partitions, pad digit 1), and
runs of the all-zero byte 121 are collapsed by zero-run encoding. Decoding
reverses the stages. The codec is biased and relies on error feedback (the
collectives keep the residual); it is not homomorphic.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from ...errors import PayloadError
from . import _kernels as K
from ..base import Codec
from ..header import FLAG_OVERFLOW
from ..registry import register_codec

__all__ = ["ThreeLCCodec", "scale_for", "quartic_encode", "quartic_decode", "zre_encode",
           "zre_decode"]

LAYOUT_FIVE_PARTITIONS = 0
#: The default sparsity multiplier, the paper's smallest. ``s = 0.5`` delivers the summed
#: gradients more accurately but did not train the digits MLP better at 3.3x the bytes
#: (docs/benchmarks.md, "Where the accuracy goes").
DEFAULT_S = 1.0
# layout id, M, quartic byte count L, ZRE byte count
_BODY_HEADER = struct.Struct("<BfQQ")
BODY_HEADER_SIZE = _BODY_HEADER.size  # 21
_F32_MAX = float(np.finfo(np.float32).max)
_ABS_MASKS = {np.dtype(np.float32): (np.uint32, np.uint32(0x7FFFFFFF)),
              np.dtype(np.float64): (np.uint64, np.uint64(0x7FFFFFFFFFFFFFFF))}
_ERRORS = {
    K.ERR_OVERFLOW: "its zero runs expand past the quartic byte count",
    K.ERR_SHORT: "it expands to fewer bytes than the quartic byte count",
    K.ERR_PAD: "a pad digit past the last element is not 1 (value 0)",
    K.ERR_NONZERO: "M is 0 but a digit is not zero",
}


def quartic_len(n):
    """Number of quartic bytes for ``n`` elements: ``ceil(n / 5)``."""
    return (n + 4) // 5


def _max_abs(x):
    """max|x| of a finite 1-D float32/float64 array, as a Python float."""
    if x.size == 0:
        return 0.0
    utype, mask = _ABS_MASKS[x.dtype]
    bits = K.max_abs_bits(x.view(utype), mask)
    return float(np.array([bits], dtype=utype).view(x.dtype)[0])


def scale_for(m, s):
    """The float32 scale ``M`` for a chunk with ``max|x| = m`` and multiplier ``s``.

    ``M = float32(m * s)`` with the product taken in float64, then two
    corrections that keep the format well defined:

    * ``M`` is capped at the largest float32, so a float32 input never
      overflows the scale (``2m`` still exceeds the capped ``M``);
    * if rounding to float32 made ``M >= 2m`` (``s`` just below 2), ``M``
      steps down to the next float32, so the largest element still rounds
      to +-1 (the ``s < 2`` progress invariant).

    Returns ``None`` if ``m`` does not fit in float32 (float64 input only);
    0.0 if ``m`` is 0 or so small that ``M`` underflows to 0.
    """
    if m > _F32_MAX:
        return None
    M = np.float32(min(m * s, _F32_MAX))
    if M > 0 and not 2.0 * m > float(M):
        M = np.nextafter(M, np.float32(0))
    return float(M)


def quartic_encode(q):
    """Pack ternary values ``q`` (-1, 0, 1; any real dtype) into ``ceil(n/5)`` quartic bytes."""
    q = np.ascontiguousarray(q, dtype=np.float32).reshape(-1)
    out = np.empty(quartic_len(q.size), dtype=np.uint8)
    K.quantize_fold(q, np.float32(1.0), out.size, out)
    return out


def quartic_decode(a, n):
    """Unpack ``ceil(n/5)`` quartic bytes into ``n`` ternary values (float32).

    Raises
    ------
    PayloadError
        If the byte count is wrong, a byte is above 242, or a pad digit is not 1.
    """
    a = np.ascontiguousarray(a, dtype=np.uint8).reshape(-1)
    if a.size != quartic_len(n):
        raise PayloadError(f"{n} elements need {quartic_len(n)} quartic bytes, got {a.size}")
    if a.size and a.max() > K.MAX_DIGIT_BYTE:
        raise PayloadError("quartic bytes must be <= 242")
    y = np.empty(n, dtype=np.float32)
    _check(K.unfold(a, np.float32(1.0), y), "quartic stream")
    return y


def zre_encode(a):
    """Zero-run encode quartic bytes ``a`` (uint8, <= 242); the result is never longer."""
    a = np.ascontiguousarray(a, dtype=np.uint8).reshape(-1)
    out = np.empty(a.size, dtype=np.uint8)
    return out[:K.zre_encode(a, out)].copy()


def zre_decode(z, L):
    """Expand a zero-run coded stream into exactly ``L`` quartic bytes.

    Raises
    ------
    PayloadError
        If the stream expands to more or fewer than ``L`` bytes.
    """
    z = np.ascontiguousarray(z, dtype=np.uint8).reshape(-1)
    if L > K.MAX_RUN * z.size:
        raise PayloadError(f"{z.size} zero-run bytes cannot expand to {L} bytes")
    out = np.empty(L, dtype=np.uint8)
    _check(K.zre_decode(z, out), "zero-run stream")
    return out


def _check(code, what):
    if code != K.OK:
        raise PayloadError(f"3lc: invalid {what}: {_ERRORS[code]}")


@register_codec
class ThreeLCCodec(Codec):
    """3LC: ternary quantization with a sparsity multiplier, quartic and zero-run coding.

    Every value becomes -M, 0 or +M with ``M = max|x| * s``; a value survives
    when ``|x| > M/2``. Five values share a byte (1.6 bits/value), and runs
    of all-zero bytes shrink to one byte per up to 14 (70 values), so sparse
    output costs as little as about 0.11 bits/value. Rounding is
    deterministic and biased: use it with error feedback (a ``key``), best
    with ``algorithm="direct"``.

    Parameters
    ----------
    s : float, default 1.0
        Sparsity multiplier, ``0 < s < 2``. Larger ``s`` zeroes more values
        (longer zero runs, smaller payloads) but leaves more of the signal
        waiting in the error-feedback residual. At ``s >= 2`` the largest
        value could round to 0 and a chunk could stall, so it is rejected.
        Below 1 (an extension of the paper's ``[1, 2)``, same wire format)
        values above ``M`` are sent as ``±M`` and the rest of them waits in
        the residual. On real gradients (4 ranks, ``direct``, error
        feedback) ``s = 0.5`` keeps the summed updates 2.9x closer to exact
        SGD's than ``s = 1`` for 2.2x the bytes, but trained the digits MLP
        no better (``docs/benchmarks.md``, "Where the accuracy goes").

    Examples
    --------
    >>> import numpy as np
    >>> from ccl.codecs import get_codec
    >>> codec = get_codec("3lc", s=1.5)
    >>> codec.decode(codec.encode(np.array([0.1, -4.0, 2.5], np.float32))).tolist()
    [0.0, -6.0, 0.0]
    """

    codec_id = "3lc"
    wire_id = 4
    device_twin = "ccl.codecs.threelc._cuda:ThreeLCTwin"  # see ccl.codecs.device
    homomorphic = False
    error_feedback = True
    # 5 ternary values per byte make 1.6 bits before the zero-run pass; in steady state
    # under error feedback on real gradients (python -m ccl.bench steady) the runs bring
    # it to 0.20 (LM) to 0.69 (CNN) bits: the median of the three models
    bits_per_value = 0.45
    encode_gbps, decode_gbps = 7.35, 5.47

    def __init__(self, s: float = DEFAULT_S) -> None:
        if isinstance(s, bool) or not isinstance(s, (int, float, np.integer, np.floating)) \
                or not 0.0 < float(s) < 2.0:
            raise ValueError(f"3lc: s must be a number with 0 < s < 2, got {s!r}")
        self.s = float(s)

    def _encode(self, x, ctx):
        n = x.size
        L = quartic_len(n)
        M = scale_for(_max_abs(x), self.s)
        if M is None:
            return np.empty(0, np.uint8), FLAG_OVERFLOW
        body = np.empty(BODY_HEADER_SIZE + L, dtype=np.uint8)
        digits = body[BODY_HEADER_SIZE:]
        if M == 0.0:
            digits[:] = K.ZERO_BYTE  # M = 0 guard: all-zero digits, never a division
        else:
            K.quantize_fold(x, x.dtype.type(M), L, digits)
        # Zero-run coding never writes ahead of what it has read, so it runs in place.
        zlen = K.zre_encode(digits, digits) if L else 0
        body[:BODY_HEADER_SIZE] = np.frombuffer(
            _BODY_HEADER.pack(LAYOUT_FIVE_PARTITIONS, M, L, zlen), dtype=np.uint8)
        return body[:BODY_HEADER_SIZE + zlen], 0

    def _parse(self, header, body):
        """Validate a body (host or device array); return ``(M, L, zlen)``."""
        n = header.n
        if body.size < BODY_HEADER_SIZE:
            raise PayloadError(f"3lc: body of {body.size} bytes is shorter than its "
                               f"{BODY_HEADER_SIZE}-byte header")
        layout, M, L, zlen = _BODY_HEADER.unpack(body[:BODY_HEADER_SIZE].tobytes())
        if layout != LAYOUT_FIVE_PARTITIONS:
            raise PayloadError(f"3lc: unknown layout id {layout} (only 0, five partitions)")
        if not math.isfinite(M) or math.copysign(1.0, M) < 0:
            raise PayloadError(f"3lc: scale M must be finite and non-negative, got {M!r}")
        if L != quartic_len(n):
            raise PayloadError(f"3lc: {n} elements need {quartic_len(n)} quartic bytes, "
                               f"the body says {L}")
        if zlen != body.size - BODY_HEADER_SIZE:
            raise PayloadError(f"3lc: body holds {body.size - BODY_HEADER_SIZE} zero-run "
                               f"bytes, its header says {zlen}")
        # Each zero-run byte expands to 1..14 quartic bytes: check both bounds before
        # allocating, so a flipped element count cannot ask for a huge buffer.
        if not zlen <= L <= K.MAX_RUN * zlen:
            raise PayloadError(f"3lc: {zlen} zero-run bytes cannot expand to {L} bytes")
        return M, L, zlen

    def _decode(self, header, body, ctx):
        M, L, _ = self._parse(header, body)
        digits = np.empty(L, dtype=np.uint8)
        _check(K.zre_decode(body[BODY_HEADER_SIZE:], digits), "zero-run stream")
        y = np.empty(header.n, dtype=np.float32)
        _check(K.unfold(digits, np.float32(M), y), "quartic stream")
        return y
