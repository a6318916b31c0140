"""Device twins of the cast codecs ``none``, ``fp16`` and ``bf16`` (see :mod:`.codec`)."""

import numpy as np
from numba import cuda

from .._cuda_common import empty_body, launch, zeros
from ..device import DeviceTwin, body_buffer, pack
from ..header import FLAG_OVERFLOW

__all__ = ["NoneTwin", "FP16Twin", "BF16Twin"]


@cuda.jit
def fp16_encode(x, bits, out, flag):
    """float32 -> IEEE half bits, round to nearest even (``_kernels.to_fp16``); flag overflow.

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
    """float32 bits -> bfloat16, round to nearest even (``_kernels.to_bf16``); flag overflow."""
    for i in range(cuda.grid(1), bits.size, cuda.gridsize(1)):
        u = bits[i]
        rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        out[i] = np.uint16(rounded)
        if (rounded & np.uint32(0x7F80)) == np.uint32(0x7F80):
            cuda.atomic.max(flag, 0, 1)


class _CastTwin(DeviceTwin):
    """Relays add decoded values and re-cast, as ``codec._CastCodec._add`` does."""

    @classmethod
    def add(cls, codec, ha, a_body, hb, b_body, ctx, be):
        total = cls.decode(codec, ha, a_body, ctx, be) + cls.decode(codec, hb, b_body, ctx, be)
        body, flags = cls.encode(codec, total, ctx, be)
        return pack(codec, body, ha.n, be, flags=flags,
                    contributors=ha.contributors + hb.contributors, dtype=ha.dtype)


class NoneTwin(_CastTwin):
    """``none`` on the device: the values' bytes."""

    @staticmethod
    def encode(codec, x, ctx, be):
        return x.view(np.uint8), 0

    @staticmethod
    def decode(codec, header, body, ctx, be):
        codec._check_body(header, body, header.dtype.itemsize)
        return body.view(header.dtype).copy()


class _HalfTwin(_CastTwin):
    """A 16-bit cast: one encode kernel that flags overflow."""

    @classmethod
    def _cast(cls, x32, out, flag, be):
        raise NotImplementedError

    @classmethod
    def encode(cls, codec, x, ctx, be):
        x32 = be.xp.ascontiguousarray(x, dtype=np.float32)
        out = body_buffer(be, 2 * x32.size).view(np.uint16)
        flag = zeros(be)
        cls._cast(x32, out, flag, be)
        if x32.size and be.to_host(flag)[0]:
            return empty_body(be), FLAG_OVERFLOW
        return out.view(np.uint8), 0


class FP16Twin(_HalfTwin):
    """``fp16`` on the device."""

    @classmethod
    def _cast(cls, x32, out, flag, be):
        launch(be, fp16_encode, x32.size, x32, x32.view(np.uint32), out, flag)

    @staticmethod
    def decode(codec, header, body, ctx, be):
        codec._check_body(header, body, 2)
        out = be.xp.empty(header.n, dtype=np.float32)
        launch(be, fp16_decode, header.n, body.view(np.uint16), out.view(np.uint32))
        return out


class BF16Twin(_HalfTwin):
    """``bf16`` on the device."""

    @classmethod
    def _cast(cls, x32, out, flag, be):
        launch(be, bf16_encode, x32.size, x32.view(np.uint32), out, flag)

    @staticmethod
    def decode(codec, header, body, ctx, be):
        codec._check_body(header, body, 2)
        return (body.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
