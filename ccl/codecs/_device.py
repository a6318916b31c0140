"""Encode, decode and add on device arrays: the GPU path of every codec.

:class:`ccl.codecs.Codec` sends device input here (cupy arrays, or numpy
arrays inside :func:`ccl._xp.simulated_device`). Payloads stay on the device
as ``uint8`` arrays with the same header and body bytes as the CPU path:
only the 32-byte header and each codec's few body-header bytes are written
from (or read into) host memory. Element-wise work runs in the numba.cuda
kernels of :mod:`ccl.codecs._cuda_kernels`; scans, sorts and selections use
the array module's own primitives (``cumsum``, ``flatnonzero``,
``partition``), which are exact, so a deterministic rule selects the same
elements as on the CPU.

Each codec's device functions are registered in :data:`IMPLEMENTATIONS` by
codec class. A codec without device functions (a user's subclass) falls
back to its CPU code on a host copy, so every codec accepts device input.
"""

import math

import numpy as np

from ..errors import PayloadError
from . import _cuda_kernels as K
from . import casts, dithering, onebit, randomk, sparse, thc, threelc
from .header import FLAG_NONFINITE, FLAG_OVERFLOW, HEADER_SIZE, Header

__all__ = ["encode", "decode", "add", "pack", "IMPLEMENTATIONS", "SPARSE"]


# ------------------------------------------------------------------ payloads
def pack(codec, body, n, be, flags=0, contributors=1, dtype=np.float32):
    """A device payload: the header (written from the host) followed by ``body``."""
    header = Header(codec.wire_id, flags, np.dtype(dtype), contributors, codec.config_hash,
                    int(n), int(body.size))
    out = be.xp.empty(HEADER_SIZE + body.size, dtype=np.uint8)
    be.upload(out[:HEADER_SIZE], np.frombuffer(header.pack(), dtype=np.uint8))
    out[HEADER_SIZE:] = body
    return out


def _empty(be):
    return be.xp.empty(0, dtype=np.uint8)


def _put(be, dst, host_bytes):
    """Write ``host_bytes`` (bytes or a uint8 array) into the device array ``dst``."""
    be.upload(dst, np.frombuffer(bytes(host_bytes), dtype=np.uint8))


def _flag(be, size=1, dtype=np.int32):
    return be.xp.zeros(size, dtype=dtype)


def _host(be, a):
    return be.to_host(a)


def _launch(be, kernel, n, *args):
    if n:
        K.launch(kernel, n, be.stream(), *args)


def _ordered_total(partial, lanes):
    """A CPU kernel's float64 total from its per-block lane sums, in the CPU's order.

    The lanes of a block are combined pairwise (``(a0 + a1) + (a2 + a3)`` ...),
    then the blocks are added one after the other.
    """
    a = partial.reshape(-1, lanes)
    while a.shape[1] > 1:
        a = a[:, 0::2] + a[:, 1::2]
    return float(np.add.accumulate(a[:, 0])[-1]) if a.shape[0] else 0.0


def _all_finite(x, be):
    return x.size == 0 or bool(be.xp.isfinite(x).all())


def encode(codec, x, ctx, be):
    """Device twin of :meth:`Codec.encode` (``x`` already checked, 1-D, contiguous)."""
    shared_bad = ctx.shared is not None and not np.isfinite(ctx.shared).all()
    if shared_bad or not _all_finite(x, be):
        return be.to_device(codec.flagged_payload(x.size, FLAG_NONFINITE))
    impl = IMPLEMENTATIONS.get(type(codec))
    if impl is None:  # no device kernels: the CPU code on a host copy
        body, flags = codec._encode(_host(be, x), ctx)
        body = be.to_device(np.asarray(body, dtype=np.uint8))
    else:
        body, flags = impl.encode(codec, x, ctx, be)
    return pack(codec, body, x.size, be, flags=flags, dtype=codec.decoded_dtype(x.dtype))


def decode(codec, header, body, ctx, be):
    """Device twin of :meth:`Codec._decode` for an unflagged payload."""
    impl = IMPLEMENTATIONS.get(type(codec))
    if impl is None:
        return be.to_device(codec._decode(header, _host(be, body), ctx))
    return impl.decode(codec, header, body, ctx, be)


def add(codec, ha, a_body, hb, b_body, ctx, be):
    """Device twin of :meth:`Codec._add` for two unflagged payloads."""
    impl = IMPLEMENTATIONS.get(type(codec))
    if impl is None or not hasattr(impl, "add"):
        return be.to_device(codec._add(ha, _host(be, a_body), hb, _host(be, b_body), ctx))
    return impl.add(codec, ha, a_body, hb, b_body, ctx, be)


# ------------------------------------------------------------------ casts
class _Casts:
    @staticmethod
    def encode(codec, x, ctx, be):
        xp = be.xp
        if isinstance(codec, casts.NoneCodec):
            return x.view(np.uint8), 0
        x32 = xp.ascontiguousarray(x, dtype=np.float32)
        out = xp.empty(x32.size, dtype=np.uint16)
        flag = _flag(be)
        if isinstance(codec, casts.FP16Codec):
            _launch(be, K.fp16_encode, x32.size, x32, x32.view(np.uint32), out, flag)
        else:
            _launch(be, K.bf16_encode, x32.size, x32.view(np.uint32), out, flag)
        if x32.size and _host(be, flag)[0]:
            return _empty(be), FLAG_OVERFLOW
        return out.view(np.uint8), 0

    @staticmethod
    def decode(codec, header, body, ctx, be):
        xp = be.xp
        if isinstance(codec, casts.NoneCodec):
            codec._check_body(header, body, header.dtype.itemsize)
            return body.view(header.dtype).copy()
        codec._check_body(header, body, 2)
        halves = body.view(np.uint16)
        if isinstance(codec, casts.FP16Codec):
            out = xp.empty(header.n, dtype=np.float32)
            _launch(be, K.fp16_decode, header.n, halves, out.view(np.uint32))
            return out
        return (halves.astype(np.uint32) << np.uint32(16)).view(np.float32)

    @classmethod
    def add(cls, codec, ha, a_body, hb, b_body, ctx, be):
        total = cls.decode(codec, ha, a_body, ctx, be) + cls.decode(codec, hb, b_body, ctx, be)
        body, flags = cls.encode(codec, total, ctx, be)
        return pack(codec, body, ha.n, be, flags=flags,
                    contributors=ha.contributors + hb.contributors, dtype=ha.dtype)


# ------------------------------------------------------------------ onebit
class _OneBit:
    @staticmethod
    def encode(codec, x, ctx, be):
        xp = be.xp
        n = x.size
        full = n // 8
        nblocks = (full + onebit._BLOCK_BYTES - 1) // onebit._BLOCK_BYTES
        body = xp.empty(onebit._SCALE.size + (n + 7) // 8, dtype=np.uint8)
        partial = xp.empty(8 * nblocks, dtype=np.float64)
        _launch(be, K.onebit_partial, partial.size, x, full, onebit._BLOCK_BYTES, partial)
        _launch(be, K.onebit_pack, body.size - onebit._SCALE.size, x, body[onebit._SCALE.size:])
        # the CPU's order: eight lane sums per block combined pairwise, blocks added in
        # order, then the tail one element at a time
        total = _ordered_total(_host(be, partial), 8)
        for v in _host(be, x[8 * full:]):
            total += float(abs(v))
        mean = total / n if n else 0.0
        with np.errstate(over="ignore"):
            scale = np.float32(mean)
        if not np.isfinite(scale):
            return _empty(be), FLAG_OVERFLOW
        _put(be, body[:onebit._SCALE.size], onebit._SCALE.pack(scale))
        return body, 0

    @staticmethod
    def decode(codec, header, body, ctx, be):
        scale, bits = codec._parse(header, body)
        out = be.xp.empty(header.n, dtype=np.float32)
        _launch(be, K.onebit_unpack, header.n, bits, scale, out)
        return out


# ------------------------------------------------------------------ 3LC
def _max_abs(x, be):
    """max|x| of a finite float32/float64 device array, as a Python float."""
    if x.size == 0:
        return 0.0
    utype, mask = threelc._ABS_MASKS[x.dtype]
    out = _flag(be, dtype=utype)
    _launch(be, K.masked_max, x.size, x.view(utype), mask, out)
    return float(_host(be, out).view(x.dtype)[0])


def _exclusive_cumsum(xp, sizes):
    offsets = xp.cumsum(sizes)
    total = int(offsets[-1]) if sizes.size else 0
    return offsets - sizes, total


def zre_encode(digits, out, be):
    """Zero-run encode ``digits`` into ``out`` (at least as long); return the length written.

    Runs of the all-zero byte are found with two flag arrays (first and last
    byte of each run); every byte learns where its code goes from an
    exclusive prefix sum of the code lengths, then one kernel writes.
    """
    xp = be.xp
    L = digits.size
    if L == 0:
        return 0
    zero = digits == threelc.K.ZERO_BYTE
    before = xp.zeros(L, dtype=bool)
    before[1:] = zero[:-1]
    after = xp.zeros(L, dtype=bool)
    after[:-1] = zero[1:]
    starts = xp.flatnonzero(zero & ~before)
    lengths = xp.flatnonzero(zero & ~after) + 1 - starts
    runs = xp.zeros(L, dtype=np.int64)
    runs[starts] = lengths
    sizes = (~zero).astype(np.int64)
    sizes[starts] = lengths // threelc.K.MAX_RUN + (lengths % threelc.K.MAX_RUN > 0)
    offsets, total = _exclusive_cumsum(xp, sizes)
    _launch(be, K.zre_scatter, L, digits, runs, offsets, out)
    return total


class _ThreeLC:
    @staticmethod
    def encode(codec, x, ctx, be):
        xp = be.xp
        n = x.size
        L = threelc.quartic_len(n)
        M = threelc.scale_for(_max_abs(x, be), codec.s)
        if M is None:
            return _empty(be), FLAG_OVERFLOW
        digits = xp.empty(L, dtype=np.uint8)
        if M == 0.0:
            digits[:] = threelc.K.ZERO_BYTE
        else:
            _launch(be, K.threelc_fold, L, x, x.dtype.type(M), L, digits)
        body = xp.empty(threelc.BODY_HEADER_SIZE + L, dtype=np.uint8)
        zlen = zre_encode(digits, body[threelc.BODY_HEADER_SIZE:], be)
        _put(be, body[:threelc.BODY_HEADER_SIZE], threelc._BODY_HEADER.pack(
            threelc.LAYOUT_FIVE_PARTITIONS, M, L, zlen))
        return body[:threelc.BODY_HEADER_SIZE + zlen], 0

    @staticmethod
    def decode(codec, header, body, ctx, be):
        xp = be.xp
        M, L, _ = codec._parse(header, body)
        z = body[threelc.BODY_HEADER_SIZE:]
        sizes = xp.where(z <= threelc.K.MAX_DIGIT_BYTE, 1, z.astype(np.int64) - threelc.K.RUN_BASE)
        offsets, total = _exclusive_cumsum(xp, sizes)
        if total != L:
            threelc._check(threelc.K.ERR_OVERFLOW if total > L else threelc.K.ERR_SHORT,
                           "zero-run stream")
        digits = xp.empty(L, dtype=np.uint8)
        _launch(be, K.zre_expand, z.size, z, offsets, digits)
        y = xp.empty(header.n, dtype=np.float32)
        err = _flag(be)
        _launch(be, K.threelc_unfold, L, digits, np.float32(M), y, err)
        code = int(_host(be, err)[0]) if L else 0
        if code:
            threelc._check(threelc.K.ERR_PAD if code & 1 else threelc.K.ERR_NONZERO,
                           "quartic stream")
        return y


# ------------------------------------------------------------------ THC
def _fwht(buf, block, be):
    h = 1
    while h < block:
        _launch(be, K.fwht_stage, buf.size // 2, buf, h)
        h *= 2


def thc_norm(x, be):
    """||x||_2 (float64) of a device array; not summed in the CPU's order."""
    xp = be.xp
    if x.size == 0:
        return 0.0
    x64 = x.astype(np.float64)
    total = float(xp.dot(x64, x64))
    if math.isfinite(total):
        return math.sqrt(total)
    big = float(xp.abs(x64).max())
    scaled = x64 / big
    return big * math.sqrt(float(xp.dot(scaled, scaled)))


class _THC:
    @staticmethod
    def encode(codec, x, ctx, be):
        xp = be.xp
        padded = codec._padded(x.size)
        if ctx.shared is None:
            norm = thc_norm(x, be)
        else:
            norm = codec._max_norm(x, ctx)
        with np.errstate(over="ignore"):
            max_norm = np.float32(norm)
        if not np.isfinite(max_norm):
            return _empty(be), FLAG_OVERFLOW
        zero = max_norm == 0 or padded == 0
        data_len = 0 if zero else padded * codec.bits // 8
        body = xp.empty(thc.BODY_HEADER_SIZE + data_len, dtype=np.uint8)
        _put(be, body[:thc.BODY_HEADER_SIZE],
             codec._body_head(thc.KIND_PACKED, 0, zero, max_norm, ctx, padded))
        if zero:
            return body, 0
        xk, thr = thc.kernel_tables(codec.levels, codec.g)
        factor = codec._encode_factor(x.size, max_norm)
        if x.dtype != np.float32:
            x, factor = (x * factor).astype(np.float32), 1.0
        rot = xp.empty(padded, dtype=np.float32)
        _launch(be, K.thc_fill, padded, x, x.size, factor, np.uint64(ctx.seed(codec.seed)),
                codec.block, rot)
        _fwht(rot, codec.block, be)
        idx = xp.empty(padded, dtype=np.uint8)
        top = xk.size - 1
        _launch(be, K.thc_round, padded, rot, np.float32(0.5 * top), top,
                np.uint64(ctx.seed(codec.seed, per_rank=True)), be.to_device(xk),
                be.to_device(thr), idx)
        _launch(be, K.pack_msb, data_len, idx, codec.bits, body[thc.BODY_HEADER_SIZE:])
        return body, 0

    @staticmethod
    def decode(codec, header, body, ctx, be):
        xp = be.xp
        width, zero, max_norm, data = codec._parse(header, body, ctx)
        n = header.n
        if zero:
            return xp.zeros(n, dtype=np.float32)
        values, offset, scale = codec._dequantizer(header, max_norm)
        padded = codec._padded(n)
        rot = xp.empty(padded, dtype=np.float32)
        _launch(be, K.thc_unrotated, padded, data, width, codec.bits, be.to_device(values),
                be.to_device(codec._levels_u32()), offset, scale, rot)
        _fwht(rot, codec.block, be)
        out = xp.empty(n, dtype=np.float32)
        _launch(be, K.thc_emit, n, rot, n, np.uint64(ctx.seed(codec.seed)), codec.block, out)
        return out

    @staticmethod
    def add(codec, ha, a_body, hb, b_body, ctx, be):
        return codec._add(ha, a_body, hb, b_body, ctx)  # array-agnostic, with thc_add_lanes


def thc_add_lanes(a, a_width, b, b_width, bits, levels, padded, out, out_width):
    """Device twin of :func:`ccl.codecs._thc_kernels.add_lanes`."""
    from .._xp import backend_of

    be = backend_of(out)
    _launch(be, K.thc_add_lanes, padded, a, a_width, b, b_width, bits, be.to_device(levels),
            out, out_width)


# ------------------------------------------------------------------ randomk
def randomk_indices(seed, d, k, be):
    """Device twin of :func:`ccl.codecs.randomk.randomk_indices` (the same sorted indices).

    Floyd's draws are independent given the seed; which of them fell back
    to ``j`` is resolved in parallel (:func:`K.floyd_mark`), and the chosen
    candidates are listed in order by ``flatnonzero`` of a byte mask.
    """
    xp = be.xp
    if not 0 <= k <= d:
        raise ValueError(f"need 0 <= k <= d, got k={k}, d={d}")
    if k == 0:
        return xp.empty(0, dtype=np.int64)
    invert = 2 * k > d
    m = d - k if invert else k
    mask = xp.zeros(d, dtype=np.uint8)
    if m:
        t = xp.empty(m, dtype=np.int64)
        seen = xp.full(d, 0xFFFFFFFF, dtype=np.uint32)
        _launch(be, K.floyd_draws, m, np.uint64(seed), d - m, t, seen)
        _launch(be, K.floyd_mark, m, t, seen, d - m, mask)
    chosen = mask == 0 if invert else mask != 0
    return xp.flatnonzero(chosen).astype(np.int64)


class _RandomK:
    @staticmethod
    def encode(codec, x, ctx, be):
        xp = be.xp
        d = x.size
        k = codec.count(d)
        seed = ctx.seed(codec.seed)
        idx = randomk_indices(seed, d, k, be)
        body = xp.empty(randomk._BODY.size + 4 * k, dtype=np.uint8)
        _put(be, body[:randomk._BODY.size], codec._body_head(k, seed, d))
        values = body[randomk._BODY.size:].view(np.float32)
        if not k:
            return body, 0
        _launch(be, K.gather, k, x, idx, d / k, bool(codec.scale), values)
        if (x.dtype != np.float32 or codec.scale) and not _all_finite(values, be):
            return _empty(be), FLAG_OVERFLOW
        return body, 0

    @staticmethod
    def decode(codec, header, body, ctx, be):
        k, values, seed = codec._parse_for(header, body, ctx)
        out = be.xp.zeros(header.n, dtype=np.float32)
        if k:
            idx = randomk_indices(seed, header.n, k, be)
            _launch(be, K.scatter, k, values, idx, out)
        return out

    @staticmethod
    def add(codec, ha, a_body, hb, b_body, ctx, be):
        # the CPU code is array-agnostic: ufuncs dispatch to the device and pack() builds
        # a device payload from a device body
        return codec._add(ha, a_body, hb, b_body, ctx)


# ------------------------------------------------------------------ dithering
def _sum_squares(x, be):
    """sum x**2 in float64, in the CPU kernel's order (bit-identical)."""
    block = dithering._BLOCK
    nblocks = (x.size + block - 1) // block
    partial = be.xp.empty(4 * nblocks, dtype=np.float64)
    _launch(be, K.sum_squares_partial, partial.size, x, block, partial)
    return _ordered_total(_host(be, partial), 4)


class _Dithering:
    @staticmethod
    def encode(codec, x, ctx, be):
        xp = be.xp
        n = x.size
        width = codec.code_dtype.itemsize
        body = xp.zeros(dithering._SCALE.size + n * width, dtype=np.uint8)
        if n == 0:
            statistic = 0.0
        elif codec.norm == "l2":
            statistic = math.sqrt(_sum_squares(x, be))
        else:
            statistic = float(xp.abs(x).max())
        scale = dithering.f32_round_up(statistic) if n else 0.0
        if scale is None:
            return _empty(be), FLAG_OVERFLOW
        _put(be, body[:dithering._SCALE.size], dithering._SCALE.pack(scale))
        if scale > 0.0:
            codes = body[dithering._SCALE.size:].view(codec.code_dtype)
            seed = np.uint64(ctx.seed(codec.seed, per_rank=True))
            s = codec.levels
            if codec.partition == "linear":
                _launch(be, K.dither_linear, n, x, s / scale, s, seed, codes)
            else:
                _launch(be, K.dither_natural, n, x, 1.0 / scale, s, seed, codes)
        return body, 0

    @staticmethod
    def decode(codec, header, body, ctx, be):
        xp = be.xp
        scale = codec._parse(header, body)
        s = codec.levels
        if not header.n:
            return xp.empty(0, dtype=np.float32)
        codes = body[dithering._SCALE.size:].view(codec.code_dtype).astype(np.int32)
        if int(xp.abs(codes).max()) > s:
            raise PayloadError(f"dithering: codes outside -{s}..{s}")
        if codec.partition == "linear":
            # float64 product rounded once to float32, as the CPU kernel
            return (codes.astype(np.float64) * (scale / s)).astype(np.float32)
        return be.to_device(codec._table(scale))[codes + s]


# ------------------------------------------------------------------ sparse
class _SparseOps:
    """Device twins of the selection and fit statistics of :mod:`ccl.codecs.sparse`.

    Selections (``count_above``, ``select_above``, ``top_k``) are exact, so
    top-k and DGC choose the CPU's elements. The SIDCo fit's moments are
    float64 sums in another order than the CPU's (and ``log`` instead of
    its polynomial), so a SIDCo threshold can differ in its last bits and,
    rarely, select one element more or fewer near the threshold.
    """

    @staticmethod
    def _xp(x):
        from .._xp import backend_of

        return backend_of(x).xp

    def count_above(self, x, t):
        return int((self._xp(x).abs(x) > t).sum())

    def select_above(self, x, t):
        xp = self._xp(x)
        return xp.flatnonzero(xp.abs(x) > t).astype(np.int64)

    def top_k(self, x, k):
        """Exact top-k of ``|x|``, ascending, ties to the lower index, zeros left out."""
        xp = self._xp(x)
        n = x.size
        if k <= 0 or n == 0:
            return xp.empty(0, dtype=np.int64)
        mag = xp.abs(x)
        if k >= n:
            return self.select_above(x, x.dtype.type(0))
        v = mag.dtype.type(float(xp.partition(mag, n - k)[n - k]))
        if v == 0:
            return self.select_above(x, x.dtype.type(0))
        above = xp.flatnonzero(mag > v)
        ties = xp.flatnonzero(mag == v)[:k - above.size]
        return xp.sort(xp.concatenate([above, ties])).astype(np.int64)

    def moments(self, x):
        xp = self._xp(x)
        a = xp.abs(x).astype(np.float64)
        return float(a.sum()), float(xp.dot(a, a))

    def log_moments(self, x):
        xp = self._xp(x)
        s1, s2 = self.moments(x)
        a = xp.abs(x).astype(np.float64)
        nonzero = a[a > 0]
        return s1, s2, float(xp.log(nonzero).sum()), int(nonzero.size)

    def tail(self, x, t):
        xp = self._xp(x)
        a = xp.abs(x)
        above = a[a > t]
        return above if above.size >= 2 else None

    def min(self, a):
        return float(a.min())

    def peak(self, x):
        return float(self._xp(x).abs(x).max())


SPARSE = _SparseOps()


class _Sparse:
    @staticmethod
    def encode(codec, x, ctx, be):
        xp = be.xp
        n = x.size
        idx = codec._select(x, ctx) if n else xp.empty(0, dtype=np.int64)
        k = int(idx.size)
        with np.errstate(over="ignore"):
            values = x[idx].astype(np.float32) if k < n else x.astype(np.float32)
        if x.dtype != np.float32 and not _all_finite(values, be):
            return _empty(be), FLAG_OVERFLOW
        max_gap = 0
        if k:
            gaps = xp.diff(idx, prepend=-1) - 1
            max_gap = int(gaps.max())
        encoding, width, index_bytes = sparse._layout(n, k, max_gap)
        head = sparse.BODY_HEAD_SIZE
        if encoding == sparse.ENC_DENSE:
            body = xp.zeros(head + 4 * n, dtype=np.uint8)
            _put(be, body[:head], sparse._BODY_HEAD.pack(sparse.ENC_DENSE, sparse.VALUES_F32,
                                                          0, n, 0))
            body[head:].view(np.float32)[idx] = values
            return body, 0
        body = xp.empty(head + index_bytes + 4 * k, dtype=np.uint8)
        _put(be, body[:head], sparse._BODY_HEAD.pack(encoding, sparse.VALUES_F32, 0, k, width))
        words = body[head:head + index_bytes].view(np.uint32)
        if encoding == sparse.ENC_ABSOLUTE:
            words[:] = idx.astype(np.uint32)
        else:
            _launch(be, K.pack_gaps, words.size, idx, width, words)
        body[head + index_bytes:].view(np.float32)[:] = values
        return body, 0

    @staticmethod
    def decode(codec, header, body, ctx, be):
        xp = be.xp
        n = header.n
        encoding, k, width, index_bytes = codec._parse(header, body, ctx)
        head = sparse.BODY_HEAD_SIZE
        if encoding == sparse.ENC_DENSE:
            return body[head:].view(np.float32).copy()
        words = body[head:head + index_bytes].view(np.uint32)
        values = body[head + index_bytes:].view(np.float32)
        out = xp.zeros(n, dtype=np.float32)
        if encoding == sparse.ENC_ABSOLUTE:
            first = xp.full(1, 4 * k + 4, dtype=np.int64)
            _launch(be, K.check_absolute, k, words, n, first)
            bad = int(_host(be, first)[0])
            if bad < 4 * k:
                codec._reject_scatter(3 if bad % 4 == 0 else 1, n)
            idx = words.astype(np.int64)
        else:
            if width == 0:
                idx = xp.arange(k, dtype=np.int64)
            else:
                steps = xp.empty(k, dtype=np.int64)
                _launch(be, K.unpack_gaps, k, words, width, steps)
                idx = xp.cumsum(steps) - 1
            if k and int(idx[-1]) >= n:
                codec._reject_scatter(1, n)
            used = k * width
            if words.size and used % 32 and int(_host(be, words[-1:])[0]) >> (used % 32):
                codec._reject_scatter(2, n)
        if k:
            _launch(be, K.scatter, k, values, idx, out)
        return out


IMPLEMENTATIONS = {
    casts.NoneCodec: _Casts, casts.FP16Codec: _Casts, casts.BF16Codec: _Casts,
    onebit.OneBitCodec: _OneBit,
    threelc.ThreeLCCodec: _ThreeLC,
    thc.THCCodec: _THC,
    randomk.RandomKCodec: _RandomK,
    dithering.DitheringCodec: _Dithering,
    sparse.TopKCodec: _Sparse, sparse.DGCCodec: _Sparse, sparse.SIDCoCodec: _Sparse,
}
