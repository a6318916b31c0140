"""Sparsifying codecs: ``topk`` and ``dgc``, and the wire format they share with ``sidco``.

Each sends a few (index, value) pairs per chunk: the selected values travel
exactly (float32), everything else decodes to zero and stays in the error
feedback residual of the collective. The codecs differ only in how they
choose the indices:

* :class:`TopKCodec` takes the exact ``k`` largest magnitudes;
* :class:`DGCCodec` estimates a threshold from a strided sample (DGC);
* :class:`~ccl.codecs.SIDCoCodec` (in :mod:`ccl.codecs.sidco`) fits a
  sparsity-inducing distribution to the magnitudes and reads the threshold
  in closed form, refined over an adapted number of stages.

The selection helpers below (:func:`top_k`, :func:`select_above`, ...) are
public so that ``sidco`` can build on them.

None is homomorphic (the union of two supports grows), so the collectives
allgather the payloads by default. Payload sizes vary with the data.

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

from .._xp import backend_of
from ..errors import PayloadError
from . import _sparse_kernels as K
from .base import Codec
from .header import FLAG_OVERFLOW, MAX_UNCHECKED_ELEMENTS
from .registry import register_codec

__all__ = ["TopKCodec", "DGCCodec", "SparseCodec", "target_count", "top_k", "top_k_of",
           "select_above", "count_above", "threshold_for", "device_ops", "check_density",
           "check_int", "TINY"]

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
    from . import _sparse_device

    return _sparse_device.OPS


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
    device_twin = "ccl.codecs._sparse_cuda:SparseTwin"  # see ccl.codecs.device
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


# ------------------------------------------------------------------- top-k
@register_codec
class TopKCodec(SparseCodec):
    """Exact top-k: the ``k`` largest magnitudes of each chunk, values sent exactly.

    Parameters
    ----------
    density : float, optional
        Fraction of each chunk to send, ``0 < density <= 1``:
        ``k = max(1, ceil(density*n))``. The default when neither is given
        is 0.01.
    k : int, optional
        Count per chunk (``>= 1``); chunks with fewer elements send all.
        Give exactly one of ``density`` and ``k``.

    Notes
    -----
    Ties go to the lower index. Exact zeros are never sent (they decode to
    the same zeros), so fewer than ``k`` pairs travel when fewer than ``k``
    elements are nonzero. Biased: the collectives keep an error feedback
    residual.

    Examples
    --------
    >>> import numpy as np
    >>> from ccl.codecs import get_codec
    >>> codec = get_codec("topk", k=2)
    >>> codec.decode(codec.encode(np.array([0.5, -3.0, 0.1, 2.0], np.float32)))
    array([ 0., -3.,  0.,  2.], dtype=float32)
    """

    codec_id = "topk"
    wire_id = 7
    encode_gbps, decode_gbps = 0.57, 10.31

    def __init__(self, density=None, k=None):
        if density is not None and k is not None:
            raise ValueError("give exactly one of density (a fraction) and k (a count), not both")
        if k is None:
            self.density = check_density(0.01 if density is None else density)
            self.k = None
        else:
            self.density = None
            self.k = check_int(k, "k", 1)

    def _select(self, x, ctx):
        k = target_count(self.density, x.size) if self.k is None else min(self.k, x.size)
        return top_k(x, k)


# --------------------------------------------------------------------- DGC
_DGC_UPPER, _DGC_LOWER, _DGC_ITERS = 1.3, 0.8, 10


@register_codec
class DGCCodec(SparseCodec):
    """DGC: a threshold from a strided sample of the magnitudes, then refined.

    Parameters
    ----------
    density : float
        Target fraction to send, ``0 < density <= 1`` (default 0.01).
    sample_ratio : float
        Fraction sampled for the threshold, ``0.01 <= sample_ratio <= 1``
        (default 0.01). At least ``2/density`` samples are taken.
    seed : int
        Base seed of the sample's random start (default 0); combined with
        the step, key and chunk, identically on every rank.

    Notes
    -----
    At most ``k = ceil(density*n)`` pairs are sent: a selection above
    ``1.3k`` is cut to its exact top-k, one between ``k`` and ``1.3k`` to
    its ``k`` largest. A selection below ``0.8k`` lowers the threshold by
    20%, up to 10 times. Momentum correction and masking belong to the
    optimizer, not to this codec.

    Examples
    --------
    >>> import numpy as np
    >>> from ccl.codecs import get_codec
    >>> codec = get_codec("dgc", density=0.01)
    >>> x = np.random.default_rng(0).standard_normal(100_000).astype(np.float32)
    >>> bool(np.count_nonzero(codec.decode(codec.encode(x))) <= 1000)   # at most k values
    True
    """

    codec_id = "dgc"
    wire_id = 8
    encode_gbps, decode_gbps = 3.46, 11.45

    def __init__(self, density=0.01, sample_ratio=0.01, seed=0):
        self.density = check_density(density)
        if isinstance(sample_ratio, bool) or \
                not isinstance(sample_ratio, (int, float, np.floating, np.integer)) or \
                not 0.01 <= float(sample_ratio) <= 1.0:
            raise ValueError(f"sample_ratio must be a number in [0.01, 1], got {sample_ratio!r}")
        self.sample_ratio = float(sample_ratio)
        self.seed = check_int(seed, "seed", 0)

    def _select(self, x, ctx):
        n = x.size
        k = target_count(self.density, n)
        if k >= n:
            return top_k(x, k)
        samples = self._sample(x, ctx)
        top = min(samples.size, max(1, math.ceil(samples.size * self.density)))
        thr = float(np.partition(samples, samples.size - top)[samples.size - top])
        for refinement in range(_DGC_ITERS + 1):
            count = count_above(x, threshold_for(x, thr))
            if count >= _DGC_LOWER * k or thr == 0.0 or refinement == _DGC_ITERS:
                break
            thr *= _DGC_LOWER
        idx = select_above(x, thr)
        return top_k_of(x, idx, k)

    def _sample(self, x, ctx):
        n = x.size
        wanted = max(math.ceil(self.sample_ratio * n), math.ceil(2.0 / self.density))
        if n <= wanted:
            return np.abs(x)
        stride = n // wanted
        # an odd stride cannot alias with the power-of-two periods of tensor layouts
        if stride > 1 and stride % 2 == 0:
            stride -= 1
        start = int(ctx.rng(self.seed).integers(0, stride))
        return np.abs(x[start::stride])
