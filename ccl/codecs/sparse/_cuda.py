"""Device twin of the sparsifying codecs (:class:`~ccl.codecs.sparse.SparseCodec`).

The body: indices as u32 words or bit-packed gaps, and the values as the
codec packs them (``_pack_values`` and ``_unpack_values`` on cupy arrays:
float32, or ``sparseloco``'s 2-bit levels). The selection: the codecs' own
``_select`` runs on the device through :data:`OPS` (what
:func:`._common.device_ops` hands out for a device array), the twins of
``sparse``'s selection kernels and of ``_HostFit``. Selections
(``count_above``, ``select_above``, ``top_k``) are exact, so top-k and DGC
choose the CPU's elements. The SIDCo fit's moments are float64 sums in
another order than the CPU's (and ``log`` instead of its polynomial), so a
SIDCo threshold can differ in its last bits and, rarely, select one element
more or fewer near the threshold.
"""

import math

import numpy as np
from numba import cuda

from ..._xp import backend_of
from .._cuda_common import LOW32, empty_body, launch, launch_blocks, put, scatter
from ..context import all_finite
from ..device import DeviceTwin, body_buffer
from ..header import FLAG_OVERFLOW
from ._common import _BODY_HEAD, BODY_HEAD_SIZE, ENC_ABSOLUTE, ENC_DENSE, VALUES_F32, _layout

__all__ = ["SparseTwin", "SparseOps", "OPS", "compact_above", "count_above"]

#: Elements per thread block of the selection kernels (a multiple of the threads of a
#: launch), and the most threads such a block has.
CHUNK, _MAX_THREADS = 4096, 256


@cuda.jit(device=True)
def _chosen(v, t, inclusive):
    a = abs(v)
    return a > t or (inclusive and a == t)


@cuda.jit
def count_chunks(x, t, inclusive, counts):
    """``counts[b]`` = how many ``|x[i]| > t`` (``>=`` if ``inclusive``) in chunk b of CHUNK."""
    total = cuda.shared.array(1, np.int64)
    for b in range(cuda.blockIdx.x, counts.size, cuda.gridDim.x):
        if cuda.threadIdx.x == 0:
            total[0] = 0
        cuda.syncthreads()
        c = 0
        for i in range(b * CHUNK + cuda.threadIdx.x, min((b + 1) * CHUNK, x.size),
                       cuda.blockDim.x):
            if _chosen(x[i], t, inclusive):
                c += 1
        cuda.atomic.add(total, 0, c)
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            counts[b] = total[0]
        cuda.syncthreads()


@cuda.jit
def write_chunks(x, t, inclusive, offsets, out):
    """The chosen indices of chunk b, ascending, from ``out[offsets[b]]`` on.

    Each thread counts the chosen among its run of consecutive elements; a
    scan of the counts in shared memory (one per chunk, so few barriers)
    gives each thread where its run's indices go.
    """
    scan = cuda.shared.array(_MAX_THREADS, np.int64)
    tid = cuda.threadIdx.x
    threads = cuda.blockDim.x
    run = CHUNK // threads
    for b in range(cuda.blockIdx.x, offsets.size, cuda.gridDim.x):
        lo = b * CHUNK + tid * run
        hi = min(lo + run, x.size)
        c = 0
        for i in range(lo, hi):
            if _chosen(x[i], t, inclusive):
                c += 1
        scan[tid] = c
        cuda.syncthreads()
        d = 1
        while d < threads:  # inclusive Hillis-Steele scan of the counts
            v = scan[tid - d] if tid >= d else 0
            cuda.syncthreads()
            scan[tid] += v
            cuda.syncthreads()
            d *= 2
        slot = offsets[b] + scan[tid] - c
        for i in range(lo, hi):
            if _chosen(x[i], t, inclusive):
                out[slot] = i
                slot += 1
        cuda.syncthreads()  # every thread read the scan before the next chunk writes it


def _chunk_counts(x, t, inclusive, be):
    counts = be.xp.empty(-(-x.size // CHUNK), dtype=np.int64)
    launch_blocks(be, count_chunks, counts.size, x, t, inclusive, counts)
    return counts


def count_above(x, t, be, inclusive=False):
    """How many ``|x| > t`` (``>= t`` if ``inclusive``): one pass, no temporary array."""
    if x.size == 0:
        return 0
    return int(_chunk_counts(x, t, inclusive, be).sum())


def compact_above(x, t, be, inclusive=False):
    """Ascending int64 indices of ``|x| > t`` (``>= t`` if ``inclusive``), in two passes.

    ``flatnonzero(abs(x) > t)`` writes two temporaries as large as ``x`` and
    scans 8 bytes per element; here each pass only reads ``x``.
    """
    xp = be.xp
    if x.size == 0:
        return xp.empty(0, dtype=np.int64)
    counts = _chunk_counts(x, t, inclusive, be)
    ends = xp.cumsum(counts)
    total = int(ends[-1])
    out = xp.empty(total, dtype=np.int64)
    if total:
        launch_blocks(be, write_chunks, counts.size, x, t, inclusive, ends - counts, out)
    return out


@cuda.jit
def pack_gaps(idx, w, out):
    """Word o of the LSB-first stream of ``w``-bit gaps ``idx[j] - idx[j-1] - 1``."""
    k = idx.size
    for o in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        word = np.uint64(0)
        lo = 32 * o
        j = lo // w
        while j < k and j * w < lo + 32:
            prev = idx[j - 1] if j > 0 else np.int64(-1)
            gap = np.uint64(idx[j] - prev - 1)
            at = j * w - lo  # bit of the word where gap j starts (may be negative)
            if at >= 0:
                word |= gap << np.uint64(at)
            else:
                word |= gap >> np.uint64(-at)
            j += 1
        out[o] = np.uint32(word & LOW32)


@cuda.jit
def unpack_gaps(words, w, gaps):
    """``gaps[j]`` = bits ``j*w .. j*w + w - 1`` of the LSB-first word stream, plus one."""
    mask = (np.uint64(1) << np.uint64(w)) - np.uint64(1)
    for j in range(cuda.grid(1), gaps.size, cuda.gridsize(1)):
        g = j * w
        o = g // 32
        at = np.uint64(g % 32)
        acc = np.uint64(words[o]) >> at
        if o + 1 < words.size:
            acc |= np.uint64(words[o + 1]) << (np.uint64(32) - at)
        gaps[j] = np.int64(acc & mask) + 1


@cuda.jit
def check_absolute(idx, n, first_error):
    """Smallest ``4*j + c`` over bad indices j: c=0 not ascending, c=1 out of range."""
    for j in range(cuda.grid(1), idx.size, cuda.gridsize(1)):
        i = np.int64(idx[j])
        if j > 0 and i <= np.int64(idx[j - 1]):
            cuda.atomic.min(first_error, 0, np.int64(4 * j))
        elif i >= n:
            cuda.atomic.min(first_error, 0, np.int64(4 * j + 1))


#: Inputs of at least this many elements find top-k's threshold among the elements above
#: a bound taken from a sample, instead of partitioning all of them.
SAMPLED_TOP_K = 1 << 18
_SAMPLE = 1 << 14


class SparseOps:
    """The device twins of ``sparse``'s selection kernels and of ``_HostFit``."""

    def __init__(self):
        self._sums = {}  # name -> cupy.ReductionKernel, made on first use

    def _sum(self, x, name):
        """A float64 sum over ``x`` in one pass (cupy), or None on other backends.

        ``abs(x).astype(float64).sum()`` first writes an array twice the size
        of a float32 ``x`` (on an H100, most of SIDCo's 8 ms at 256 MB).
        """
        be = backend_of(x)
        if be.name != "cupy":
            return None
        kernel = self._sums.get(name)
        if kernel is None:
            term = {"abs": "fabs((double)x)", "square": "(double)x * (double)x",
                    "log": "x != 0 ? log(fabs((double)x)) : 0.0",
                    "nonzero": "x != 0 ? 1.0 : 0.0"}[name]
            kernel = be.xp.ReductionKernel("T x", "float64 y", term, "a + b", "y = a", "0",
                                           f"ccl_sum_{name}")
            self._sums[name] = kernel
        return float(kernel(x))

    @staticmethod
    def _xp(x):
        return backend_of(x).xp

    def count_above(self, x, t):
        return count_above(x, t, backend_of(x))

    def select_above(self, x, t):
        return compact_above(x, t, backend_of(x))

    def top_k(self, x, k):
        """Exact top-k of ``|x|``, ascending, ties to the lower index, zeros left out.

        A large input is first cut down to the elements at or above a bound
        that a strided sample puts a little below the k-th largest (checked:
        when fewer than k are left, all of them are taken); the k-th largest
        is then found among those alone. On an H100, partitioning all of a
        256 MB input was most of a 6 ms top-k encode.
        """
        xp = self._xp(x)
        n = x.size
        if k <= 0 or n == 0:
            return xp.empty(0, dtype=np.int64)
        if k >= n:
            return self.select_above(x, x.dtype.type(0))
        be = backend_of(x)
        mag = xp.abs(x)
        idx = None
        if n >= SAMPLED_TOP_K:
            bound = mag.dtype.type(self._bound_below(xp, mag, k))
            idx = compact_above(mag, bound, be, inclusive=True)
            if idx.size < k:  # the sample misled: take every element
                idx = None
        values = mag if idx is None else mag[idx]
        v = mag.dtype.type(float(xp.partition(values, values.size - k)[values.size - k]))
        if v == 0:
            return self.select_above(x, x.dtype.type(0))
        if idx is None:
            taken = compact_above(mag, v, be, inclusive=True)
        else:
            taken = idx[values >= v]
        if taken.size == k:  # no tie at v beyond the quota
            return taken
        if idx is None:
            above, ties = compact_above(mag, v, be), xp.flatnonzero(mag == v)
        else:
            above, ties = idx[values > v], idx[values == v]
        ties = ties[:k - above.size]
        return xp.sort(xp.concatenate([above, ties])).astype(np.int64)

    @staticmethod
    def _bound_below(xp, mag, k):
        """A value a little below the k-th largest of ``mag``, from a strided sample."""
        n = mag.size
        sample = xp.sort(mag[::n // _SAMPLE])
        s = sample.size
        q = k / n
        # the k-th largest sits near ascending rank s*(1-q) of the sample; step down by
        # four binomial standard deviations and a few ranks more
        rank = s * (1 - q) - 4 * math.sqrt(s * q * (1 - q)) - 8
        return sample[max(0, int(rank))].item()

    def moments(self, x):
        s1 = self._sum(x, "abs")
        if s1 is not None:
            return s1, self._sum(x, "square")
        xp = self._xp(x)
        a = xp.abs(x).astype(np.float64)
        return float(a.sum()), float(xp.dot(a, a))

    def log_moments(self, x):
        s1, s2 = self.moments(x)
        slog = self._sum(x, "log")
        if slog is not None:
            return s1, s2, slog, int(self._sum(x, "nonzero"))
        xp = self._xp(x)
        a = xp.abs(x).astype(np.float64)
        nonzero = a[a > 0]
        return s1, s2, float(xp.log(nonzero).sum()), int(nonzero.size)

    def tail(self, x, t):
        above = self._xp(x).abs(x[self.select_above(x, t)])
        return above if above.size >= 2 else None

    def min(self, a):
        return float(a.min())

    def peak(self, x):
        return float(self._xp(x).abs(x).max())


OPS = SparseOps()


class SparseTwin(DeviceTwin):
    """The sparse codecs on the device (a subclass's ``_select`` and value packing are used)."""

    replaces = DeviceTwin.replaces + ("_body",)
    ops = OPS  # the selections on the device (_common.device_ops)

    @staticmethod
    def encode(codec, x, ctx, be):
        xp = be.xp
        n = x.size
        idx = codec._select(x, ctx) if n else xp.empty(0, dtype=np.int64)
        k = int(idx.size)
        with np.errstate(over="ignore"):
            values = x[idx].astype(np.float32) if k < n else x.astype(np.float32)
        if x.dtype != np.float32 and not all_finite(values):
            return empty_body(be), FLAG_OVERFLOW
        max_gap = 0
        if k:
            gaps = xp.diff(idx, prepend=-1) - 1
            max_gap = int(gaps.max())
        encoding, width, index_bytes = _layout(n, k, max_gap, codec._value_bytes(k))
        head = BODY_HEAD_SIZE
        if encoding == ENC_DENSE:
            body = xp.zeros(head + 4 * n, dtype=np.uint8)
            put(be, body[:head], _BODY_HEAD.pack(ENC_DENSE, VALUES_F32, 0, n, 0))
            body[head:].view(np.float32)[idx] = values
            return body, 0
        body = body_buffer(be, head + index_bytes + codec._value_bytes(k))
        put(be, body[:head], _BODY_HEAD.pack(encoding, codec.value_format, 0, k, width))
        words = body[head:head + index_bytes].view(np.uint32)
        if encoding == ENC_ABSOLUTE:
            words[:] = idx.astype(np.uint32)
        else:
            launch(be, pack_gaps, words.size, idx, width, words)
        body[head + index_bytes:] = codec._pack_values(values, xp)
        return body, 0

    @staticmethod
    def decode(codec, header, body, ctx, be):
        xp = be.xp
        n = header.n
        encoding, k, width, index_bytes = codec._parse(header, body, ctx)
        head = BODY_HEAD_SIZE
        if encoding == ENC_DENSE:
            return body[head:].view(np.float32).copy()
        words = body[head:head + index_bytes].view(np.uint32)
        values = codec._unpack_values(body[head + index_bytes:], k, xp)
        out = xp.zeros(n, dtype=np.float32)
        if encoding == ENC_ABSOLUTE:
            first = xp.full(1, 4 * k + 4, dtype=np.int64)
            launch(be, check_absolute, k, words, n, first)
            bad = int(be.to_host(first)[0])
            if bad < 4 * k:
                codec._reject_scatter(3 if bad % 4 == 0 else 1, n)
            idx = words.astype(np.int64)
        else:
            if width == 0:
                idx = xp.arange(k, dtype=np.int64)
            else:
                steps = xp.empty(k, dtype=np.int64)
                launch(be, unpack_gaps, k, words, width, steps)
                idx = xp.cumsum(steps) - 1
            if k and int(idx[-1]) >= n:
                codec._reject_scatter(1, n)
            used = k * width
            if words.size and used % 32 and int(be.to_host(words[-1:])[0]) >> (used % 32):
                codec._reject_scatter(2, n)
        if k:
            launch(be, scatter, k, values, idx, out)
        return out
