"""The ``onebit`` codec: one sign bit per value and one float32 scale per chunk.

Each value ``x_i`` is sent as its sign and decoded as ``+scale`` or
``-scale`` with ``scale = mean|x|``, the magnitude that minimises
``||x - scale * sign(x)||_2`` for the given signs. The estimate is biased:
the collectives keep an error-feedback residual at every lossy point
(worker, relay, owner). Payloads of different ranks carry different scales,
so they do not add in the compressed domain; the ``direct`` collective
decodes, sums and re-encodes at the block owner.

Body layout (little-endian, after the 32-byte header)::

    offset 0   float32  scale (finite, >= 0)
    offset 4   ceil(n / 8) bytes of sign bits: bit 1 means negative;
               element i is bit 7 - (i % 8) of byte i // 8 (numpy.packbits
               order, most significant bit first); unused low bits of the
               last byte are zero.
"""

import struct

import numpy as np

from ...errors import PayloadError
from ..base import Codec
from ..header import FLAG_OVERFLOW
from ..registry import register_codec
from ._kernels import BLOCK_BYTES, pack_signs, unpack_signs

__all__ = ["OneBitCodec"]

_SCALE = struct.Struct("<f")
@register_codec
class OneBitCodec(Codec):
    """Scaled sign: 1 bit per value plus a float32 scale ``mean|x|`` per chunk.

    About 32x smaller than float32. Biased, so the collectives apply error
    feedback at every lossy point; not homomorphic (per-rank scales), so it
    fits the ``direct`` collective (worker and owner error feedback, as in
    BytePS-Compress). Zero is sent as positive.

    Examples
    --------
    >>> import numpy as np
    >>> from ccl.codecs import OneBitCodec
    >>> codec = OneBitCodec()
    >>> codec.decode(codec.encode(np.array([1.0, -3.0, 0.0, 2.0], np.float32)))
    array([ 1.5, -1.5,  1.5,  1.5], dtype=float32)
    """

    codec_id = "onebit"
    wire_id = 10
    device_twin = "ccl.codecs.onebit._cuda:OneBitTwin"  # see ccl.codecs.device
    homomorphic = False
    error_feedback = True
    bits_per_value = 1.1  # a bit per value, plus a scale per chunk
    encode_gbps, decode_gbps = 5.32, 5.64

    def _encode(self, x, ctx):
        n = x.size
        nbytes = (n + 7) // 8
        body = np.empty(_SCALE.size + nbytes, dtype=np.uint8)
        partial = np.empty((n // 8 + BLOCK_BYTES - 1) // BLOCK_BYTES, dtype=np.float64)
        total = pack_signs(x, body[_SCALE.size:], partial) if n else 0.0
        mean = total / n if n else 0.0
        with np.errstate(over="ignore"):  # a float64 mean above the float32 range is flagged
            scale = np.float32(mean)
        if not np.isfinite(scale):
            return np.empty(0, np.uint8), FLAG_OVERFLOW
        body[:_SCALE.size] = np.frombuffer(_SCALE.pack(scale), dtype=np.uint8)
        return body, 0

    def _parse(self, header, body):
        """Validate a body (host or device array); return ``(scale, bits)``."""
        n = header.n
        nbytes = (n + 7) // 8
        if body.size != _SCALE.size + nbytes:
            raise PayloadError(f"onebit: body of {body.size} bytes cannot hold {n} values "
                               f"(expected {_SCALE.size + nbytes})")
        (scale,) = _SCALE.unpack(body[:_SCALE.size].tobytes())
        if not np.isfinite(scale) or scale < 0:
            raise PayloadError(f"onebit: invalid scale {scale!r}")
        bits = body[_SCALE.size:]
        spare = 8 * nbytes - n
        if spare and int(bits[-1]) & ((1 << spare) - 1):
            raise PayloadError("onebit: padding bits of the last byte are not zero")
        return np.float32(scale), bits

    def _decode(self, header, body, ctx):
        scale, bits = self._parse(header, body)
        out = np.empty(header.n, dtype=np.float32)
        if header.n:
            unpack_signs(bits, scale, out)
        return out
