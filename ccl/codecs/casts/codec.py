"""Lossless and cast codecs: ``none``, ``fp16`` and ``bf16``.

All three are homomorphic: relays add decoded partial sums in float32 (or the
input's dtype for ``none``) and re-cast. ``fp16`` and ``bf16`` pre-divide for
``op="mean"`` so that a sum of many ranks does not overflow the narrow
format, and flag ``OVERFLOW`` (never a silent Inf) when a finite value does
not fit.
"""

import numpy as np

from ...errors import PayloadError
from ..base import Codec
from ..context import all_finite
from ..header import FLAG_OVERFLOW
from ..registry import register_codec
from ._kernels import FP16_TO_FP32, from_fp16, to_bf16, to_fp16

__all__ = ["NoneCodec", "FP16Codec", "BF16Codec"]


class _CastCodec(Codec):
    """Shared behaviour of codecs that send each value in a fixed-width format."""

    homomorphic = True
    error_feedback = False

    def _add(self, ha, a_body, hb, b_body, ctx):
        contributors = ha.contributors + hb.contributors
        with np.errstate(over="ignore"):
            total = self._decode(ha, a_body, ctx) + self._decode(hb, b_body, ctx)
        if not all_finite(total):  # finite payloads, infinite sum: the format overflowed
            return self.flagged_payload(ha.n, FLAG_OVERFLOW, contributors, dtype=ha.dtype)
        body, flags = self._encode(total, ctx)
        return self.pack(body, ha.n, flags=flags, contributors=contributors, dtype=ha.dtype)

    def _check_body(self, header, body, itemsize):
        if body.size != header.n * itemsize:
            raise PayloadError(f"codec {self.codec_id!r}: body of {body.size} bytes for "
                               f"{header.n} elements of {itemsize} bytes")


class _HalfCodec(_CastCodec):
    """A cast codec to a 16-bit format: the kernel that writes the bits is all that differs.

    ``_to_half(x32, out)`` writes the 16-bit patterns of the float32 ``x32``
    into the ``uint16`` array ``out`` and returns True when a finite value
    overflowed the format.
    """

    predivide_mean = True
    sum_rounds = True  # a sum of two payloads is rounded to 16 bits again
    bits_per_value = 16.0
    _to_half = None

    def _encode(self, x, ctx):
        x32 = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty(x32.size, dtype=np.uint16)
        if x32.size and self._to_half(x32, out):
            return np.empty(0, np.uint8), FLAG_OVERFLOW
        return out.view(np.uint8), 0


@register_codec
class NoneCodec(_CastCodec):
    """No compression: values travel in the input's own dtype.

    With an explicit algorithm the result equals the exact sum to the
    input dtype's rounding; with ``algorithm="auto"`` the collectives hand
    the array to the MPI library's own ``Allreduce``.

    Examples
    --------
    >>> import numpy as np
    >>> from ccl.codecs import NoneCodec
    >>> x = np.array([1.5, -2.0], np.float64)
    >>> NoneCodec().decode(NoneCodec().encode(x))
    array([ 1.5, -2. ])
    """

    codec_id = "none"
    wire_id = 1
    device_twin = "ccl.codecs.casts._cuda:NoneTwin"  # see ccl.codecs.device
    input_dtypes = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16))
    identity = True
    encode_gbps, decode_gbps = 5.35, 4.92

    def decoded_dtype(self, input_dtype):
        """The input's own dtype: values travel uncast.

        Parameters
        ----------
        input_dtype : numpy.dtype
            The dtype given to :meth:`~ccl.codecs.Codec.encode`.

        Returns
        -------
        numpy.dtype
            ``input_dtype`` itself.
        """
        return np.dtype(input_dtype)

    def _encode(self, x, ctx):
        return x.view(np.uint8), 0

    def _decode(self, header, body, ctx):
        self._check_body(header, body, header.dtype.itemsize)
        return body.view(header.dtype).copy()


@register_codec
class FP16Codec(_HalfCodec):
    """IEEE half precision: 16 bits per value, 2x smaller than float32.

    Values above 65504 in magnitude do not fit: the payload is flagged
    ``OVERFLOW`` and the collective raises
    :class:`ccl.CompressionOverflowError` on every rank. ``op="mean"``
    divides before the cast, which keeps averaged gradients in range.

    Examples
    --------
    >>> import numpy as np
    >>> from ccl.codecs import FP16Codec
    >>> codec = FP16Codec()
    >>> payload = codec.encode(np.array([1.0, 1e-4, 3.14159], np.float32))
    >>> payload.size                     # 32-byte header + 3 x 2 bytes
    38
    >>> codec.decode(payload).tolist()
    [1.0, 0.00010001659393310547, 3.140625]
    """

    codec_id = "fp16"
    wire_id = 2
    device_twin = "ccl.codecs.casts._cuda:FP16Twin"  # see ccl.codecs.device
    _to_half = staticmethod(to_fp16)
    encode_gbps, decode_gbps = 2.13, 2.52

    def _decode(self, header, body, ctx):
        self._check_body(header, body, 2)
        out = np.empty(header.n, dtype=np.float32)
        from_fp16(body.view(np.uint16), FP16_TO_FP32, out)
        return out


@register_codec
class BF16Codec(_HalfCodec):
    """bfloat16: float32's exponent range with 8 bits of mantissa, 16 bits per value.

    Sent as bytes: the PyPI MPI wheels have no bfloat16 datatype.

    Examples
    --------
    >>> import numpy as np
    >>> from ccl.codecs import BF16Codec
    >>> codec = BF16Codec()
    >>> codec.decode(codec.encode(np.array([1.0, 3.14159, -0.1], np.float32))).tolist()
    [1.0, 3.140625, -0.10009765625]
    """

    codec_id = "bf16"
    wire_id = 3
    device_twin = "ccl.codecs.casts._cuda:BF16Twin"  # see ccl.codecs.device
    _to_half = staticmethod(to_bf16)
    encode_gbps, decode_gbps = 5.50, 6.21

    def _decode(self, header, body, ctx):
        self._check_body(header, body, 2)
        return (body.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
