"""What the sparsifying codecs share: their wire format, decoding and selection helpers.

Each sparsifier (:mod:`.topk`, :mod:`.sidco`, :mod:`.sparseloco`) sends a
few (index, value) pairs per chunk and differs only in how it chooses the
indices; :class:`SparseCodec` writes and reads the pairs. The selection
helpers (:func:`top_k`, :func:`select_above`, ...) run the kernels of
:mod:`._kernels` on the host, or their device versions in :mod:`._cuda`.
This module is private to the sparse family.

Body layout (after the 32-byte header, little-endian; see
``docs/codecs/sparse.md``)::

    u8  index encoding   0 = u32 absolute, 1 = bit-packed gaps, 2 = dense f32
    u8  value format     0 = f32, 1 = 2-bit levels (``sparseloco``)
    u16 reserved         0
    u64 count            k (n for the dense encoding)
    u32 width            bits per index: 32 (absolute), 0..32 (gaps), 0 (dense)
    indices              4*k bytes, or 4*ceil(k*w/32) bytes of packed gaps, or none
    values               4*k bytes of f32, or (2-bit levels) two f32 levels and
                         4*ceil(k/16) bytes of 2-bit codes
"""

import math
import struct

import numpy as np

from ..._xp import backend_of
from ...errors import PayloadError
from . import _kernels as K
from ..base import Codec
from ..header import FLAG_OVERFLOW, MAX_UNCHECKED_ELEMENTS

__all__ = ["SparseCodec", "target_count", "top_k", "top_k_of", "select_above", "count_above",
           "threshold_for", "device_ops", "check_density", "check_int", "TINY"]

_BODY_HEAD = struct.Struct("<BBHQI")
BODY_HEAD_SIZE = _BODY_HEAD.size  # 16
ENC_ABSOLUTE, ENC_GAPS, ENC_DENSE = 0, 1, 2
VALUES_F32, VALUES_2BIT = 0, 1

# Below this many elements a fit is noise and exact top-k is cheap.
TINY = 1024


# --------------------------------------------------------------- validation
def check_density(density, name="density"):
    """``density`` as a float, or ValueError unless ``0 < density <= 1``."""
    if isinstance(density, bool) or not isinstance(density, (int, float, np.floating, np.integer)) \
            or not 0.0 < float(density) <= 1.0:
        raise ValueError(f"{name} must be a number with 0 < {name} <= 1, got {density!r}")
    return float(density)


def check_int(value, name, minimum):
    """``value`` as an int, or ValueError unless it is an int (not a bool) ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def target_count(density, n):
    """Target count for a density: ``max(1, ceil(density*n))``, 0 for an empty chunk."""
    return 0 if n == 0 else min(n, max(1, math.ceil(density * n)))


# ------------------------------------------------------------------- helpers
def device_ops(x):
    """The device twins of the selection kernels when ``x`` is a device array, else None."""
    if not backend_of(x).device:
        return None
    from ..device import twin_for  # loads the twin's module, and numba.cuda, only now

    return twin_for(SparseCodec).ops


def count_above(x, t):
    """How many ``|x| > t`` (``t`` of x's dtype)."""
    ops = device_ops(x)
    return ops.count_above(x, t) if ops else int(K.count_above(x, t))


def threshold_for(x, thr):
    """Cast a float64 threshold to x's dtype so that ``|x| > result`` iff ``|x| > thr``."""
    t = x.dtype.type(thr)
    if float(t) > thr:
        t = np.nextafter(t, x.dtype.type(-np.inf))
    return t


def select_above(x, thr):
    """Ascending indices with ``|x| > thr`` and their count, in two streaming passes."""
    t = threshold_for(x, thr)
    ops = device_ops(x)
    if ops:
        return ops.select_above(x, t)
    count = int(K.count_above(x, t))
    out = np.empty(count, dtype=np.int64)
    K.select_above(x, t, out)
    return out


def top_k(x, k):
    """Exact top-k of ``|x|``: ascending indices, ties to the lower index, exact zeros left out."""
    n = x.size
    ops = device_ops(x)
    if ops:
        return ops.top_k(x, k)
    if k <= 0 or n == 0:
        return np.empty(0, dtype=np.int64)
    if k >= n:
        return select_above(x, 0.0)
    mag = np.abs(x)
    v = mag.dtype.type(np.partition(mag, n - k)[n - k])
    if v == 0:
        return select_above(x, 0.0)  # fewer than k nonzeros: send them all
    quota = k - int(K.count_above(mag, v))
    out = np.empty(k, dtype=np.int64)
    K.take_top(mag, v, quota, out)
    return out


def top_k_of(x, idx, k):
    """Exact top-k of ``|x[idx]|`` (``idx`` ascending), ascending, ties to the lower index."""
    if idx.size <= k:
        return idx
    return idx[top_k(x[idx], k)]


def _layout(n, k, max_gap, value_bytes=None):
    """``(encoding, width, index bytes)`` of k indices of n elements whose largest gap is given.

    Bit-packed gaps unless absolute u32 indices are no larger; dense when the
    indices and values (``value_bytes``, default ``4*k``) would not be smaller
    than the dense array.
    """
    width = int(max(max_gap, 0)).bit_length() if k else 0
    gap_words = (k * width + 31) // 32
    sparse_index_bytes = 4 * gap_words
    encoding = ENC_GAPS
    if width > 32:  # only possible beyond 2**32 elements
        encoding = ENC_DENSE
    elif gap_words >= k and n <= 1 << 32:
        encoding, width, sparse_index_bytes = ENC_ABSOLUTE, 32, 4 * k
    value_bytes = 4 * k if value_bytes is None else value_bytes
    if encoding == ENC_DENSE or sparse_index_bytes + value_bytes >= 4 * n:
        return ENC_DENSE, 0, 0
    return encoding, width, sparse_index_bytes


def _reject(codec, msg):
    raise PayloadError(f"codec {codec.codec_id!r}: {msg}")


# ---------------------------------------------------------------- base class
class SparseCodec(Codec):
    """Wire format and decoding shared by the sparsifying codecs.

    Subclasses implement :meth:`_select`, returning ascending int64 indices.
    A subclass that sends its values otherwise than as float32 sets
    ``value_format`` and overrides :meth:`_value_bytes`, :meth:`_pack_values`
    and :meth:`_unpack_values` (the device twin calls them too).
    """

    homomorphic = False
    error_feedback = True
    sparse = True
    device_twin = "ccl.codecs.sparse._cuda:SparseTwin"  # see ccl.codecs.device
    value_format = VALUES_F32

    @property
    def bits_per_value(self):
        """Expected payload bits per value: a value and an index per kept element."""
        return 64.0 * self.density if self.density is not None else 32.0

    def _select(self, x, ctx):
        raise NotImplementedError

    def _value_bytes(self, k):
        """Bytes of the values of ``k`` selected elements in a sparse body."""
        return 4 * k

    def _pack_values(self, values, xp):
        """The value bytes (``uint8``, of ``xp``) of the float32 ``values`` of a sparse body."""
        return values.view(np.uint8)

    def _unpack_values(self, raw, k, xp):
        """The ``k`` float32 values of the checked value bytes ``raw`` (an ``xp`` array)."""
        return _f32(raw) if xp is np else raw.view(np.float32)

    def _encode(self, x, ctx):
        idx = self._select(x, ctx) if x.size else np.empty(0, dtype=np.int64)
        return self._body(x, idx)

    def _body(self, x, idx):
        n, k = x.size, idx.size
        with np.errstate(over="ignore"):  # reported by the flag below
            values = x[idx].astype(np.float32) if k < n else x.astype(np.float32)
        if x.dtype != np.float32 and not np.isfinite(values).all():
            return np.empty(0, np.uint8), FLAG_OVERFLOW
        encoding, width, sparse_index_bytes = _layout(n, k, int(K.max_gap(idx)) if k else 0,
                                                      self._value_bytes(k))
        if encoding == ENC_DENSE:
            body = np.empty(BODY_HEAD_SIZE + 4 * n, dtype=np.uint8)
            body[:BODY_HEAD_SIZE] = np.frombuffer(
                _BODY_HEAD.pack(ENC_DENSE, VALUES_F32, 0, n, 0), dtype=np.uint8)
            dense = body[BODY_HEAD_SIZE:].view(np.float32)
            if k == n:
                dense[:] = values
            else:
                dense[:] = 0.0
                dense[idx] = values
            return body, 0
        body = np.empty(BODY_HEAD_SIZE + sparse_index_bytes + self._value_bytes(k),
                        dtype=np.uint8)
        body[:BODY_HEAD_SIZE] = np.frombuffer(
            _BODY_HEAD.pack(encoding, self.value_format, 0, k, width), dtype=np.uint8)
        index_part = body[BODY_HEAD_SIZE:BODY_HEAD_SIZE + sparse_index_bytes].view(np.uint32)
        if encoding == ENC_ABSOLUTE:
            index_part[:] = idx
        else:
            K.pack_gaps(idx, width, index_part)
        body[BODY_HEAD_SIZE + sparse_index_bytes:] = self._pack_values(values, np)
        return body, 0

    def _parse(self, header, body, ctx):
        """Validate a body (host or device array); return ``(encoding, k, width, index bytes)``."""
        n = header.n
        if body.size < BODY_HEAD_SIZE:
            _reject(self, f"body of {body.size} bytes is shorter than its "
                          f"{BODY_HEAD_SIZE}-byte head")
        encoding, value_format, reserved, k, width = _BODY_HEAD.unpack(
            body[:BODY_HEAD_SIZE].tobytes())
        if value_format != (VALUES_F32 if encoding == ENC_DENSE else self.value_format):
            _reject(self, f"value format {value_format} is not this codec's")
        if reserved:
            _reject(self, "reserved body field is not zero")
        rest = body.size - BODY_HEAD_SIZE
        if encoding == ENC_DENSE:
            if k != n or width != 0 or rest != 4 * n:
                _reject(self, f"dense body of {rest} bytes, count {k}, width {width} "
                              f"for {n} elements")
            return encoding, k, width, 0
        if encoding not in (ENC_ABSOLUTE, ENC_GAPS):
            _reject(self, f"unknown index encoding {encoding}")
        if k > n:
            _reject(self, f"count {k} exceeds the {n} elements")
        # the smallest possible body bounds k before any size arithmetic
        value_bytes = self._value_bytes(k)
        if value_bytes > rest:
            _reject(self, f"count {k} does not fit a body of {rest} bytes")
        if encoding == ENC_ABSOLUTE:
            if width != 32:
                _reject(self, f"absolute indices must be 32 bits wide, not {width}")
            index_bytes = 4 * k
        else:
            if width > 32:
                _reject(self, f"gap width {width} exceeds 32 bits")
            index_bytes = 4 * ((k * width + 31) // 32)
        if rest != index_bytes + value_bytes:
            _reject(self, f"body of {rest} bytes does not match {k} indices "
                          f"({index_bytes} bytes) and {k} values ({value_bytes} bytes)")
        if ctx.n is None and n > MAX_UNCHECKED_ELEMENTS:
            _reject(self, f"payload claims {n} elements; pass CodecContext(n=...) to decode "
                          "payloads this large")
        return encoding, k, width, index_bytes

    def _reject_scatter(self, err, n):
        if err == 1:
            _reject(self, f"an index is out of range for {n} elements")
        if err == 2:
            _reject(self, "nonzero padding after the last index gap")
        if err == 3:
            _reject(self, "indices are not strictly ascending")

    def _decode(self, header, body, ctx):
        n = header.n
        encoding, k, width, index_bytes = self._parse(header, body, ctx)
        if encoding == ENC_DENSE:
            return _f32(body[BODY_HEAD_SIZE:]).copy()
        words = _u32(body[BODY_HEAD_SIZE:BODY_HEAD_SIZE + index_bytes])
        values = self._unpack_values(body[BODY_HEAD_SIZE + index_bytes:], k, np)
        out = np.zeros(n, dtype=np.float32)
        if encoding == ENC_ABSOLUTE:
            err = K.scatter_absolute(words, values, out)
        else:
            err = K.scatter_gaps(words, k, width, values, out)
        self._reject_scatter(err, n)
        return out


def _aligned(view):
    return view if view.flags.aligned else view.copy()


def _f32(raw):
    return _aligned(raw.view(np.float32))


def _u32(raw):
    return _aligned(raw.view(np.uint32))
