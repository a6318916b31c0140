"""Sparsifying codecs: ``sidco``, ``topk`` and ``dgc``.

Each sends a few (index, value) pairs per chunk: the selected values travel
exactly (float32), everything else decodes to zero and stays in the error
feedback residual of the collective. The codecs differ only in how they
choose the indices:

* :class:`TopKCodec` takes the exact ``k`` largest magnitudes;
* :class:`DGCCodec` estimates a threshold from a strided sample (DGC);
* :class:`SIDCoCodec` fits a sparsity-inducing distribution (exponential,
  generalized Pareto or gamma) to the magnitudes and reads the threshold in
  closed form, optionally refined over several stages (SIDCo).

None is homomorphic (the union of two supports grows), so the collectives
allgather the payloads by default. Payload sizes vary with the data.

Body layout (after the 32-byte header, little-endian; see
``docs/codecs/sparse.md``)::

    u8  index encoding   0 = u32 absolute, 1 = bit-packed gaps, 2 = dense f32
    u8  value format     0 = f32
    u16 reserved         0
    u64 count            k (n for the dense encoding)
    u32 width            bits per index: 32 (absolute), 0..32 (gaps), 0 (dense)
    indices              4*k bytes, or 4*ceil(k*w/32) bytes of packed gaps, or none
    values               4*k bytes of f32
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

__all__ = ["SIDCoCodec", "TopKCodec", "DGCCodec", "exp_threshold", "gpareto_threshold",
           "gamma_threshold"]

_BODY_HEAD = struct.Struct("<BBHQI")
BODY_HEAD_SIZE = _BODY_HEAD.size  # 16
ENC_ABSOLUTE, ENC_GAPS, ENC_DENSE = 0, 1, 2
VALUES_F32 = 0

# Below this many elements a fit is noise and exact top-k is cheap.
TINY = 1024
# Magnitudes whose variance is below this fraction of their squared mean are
# treated as constant: no fit is meaningful, exact top-k decides.
_CONSTANT_RTOL = 1e-9


# --------------------------------------------------------------- validation
def _check_density(density, name="density"):
    if isinstance(density, bool) or not isinstance(density, (int, float, np.floating, np.integer)) \
            or not 0.0 < float(density) <= 1.0:
        raise ValueError(f"{name} must be a number with 0 < {name} <= 1, got {density!r}")
    return float(density)


def _check_int(value, name, minimum):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _k_for(density, n):
    """Target count for a density: ``max(1, ceil(density*n))``, 0 for an empty chunk."""
    return 0 if n == 0 else min(n, max(1, math.ceil(density * n)))


# ------------------------------------------------------------ threshold fits
def exp_threshold(mean, delta):
    """Exponential fit: ``mean * ln(1/delta)``, the level exceeded with probability ``delta``.

    Examples
    --------
    >>> round(exp_threshold(1e-3, 0.01), 7)
    0.0046052
    """
    return mean * math.log(1.0 / delta)


def gpareto_threshold(mean, var, delta):
    """Generalized Pareto fit by moments: the ``1 - delta`` quantile.

    ``xi = (1 - mean**2/var)/2`` and ``sigma = mean*(mean**2/var + 1)/2``;
    the threshold is ``sigma/xi * (delta**-xi - 1)``, or its exponential
    limit ``sigma*ln(1/delta)`` when ``|xi|`` is tiny. Returns None when
    ``var <= 0`` (no fit; the caller falls back to exact top-k).
    """
    if not var > 0.0:
        return None
    ratio = mean * mean / var
    xi = 0.5 * (1.0 - ratio)
    sigma = 0.5 * mean * (ratio + 1.0)
    if abs(xi) < 1e-7:
        return sigma * math.log(1.0 / delta)
    return sigma / xi * math.expm1(-xi * math.log(delta))


def gamma_threshold(mean, mean_log, delta):
    """Gamma fit by approximate maximum likelihood: the ``1 - delta`` quantile.

    ``s = ln(mean) - mean_log``, ``alpha = (3 - s + sqrt((s-3)**2 + 24s))/(12s)``,
    ``beta = mean/alpha``; the quantile is ``beta * Q^-1(alpha, delta)``
    (scipy's ``gammainccinv``, the same number as ``gammaincinv(alpha,
    1 - delta)`` without the cancellation in ``1 - delta``). Without SciPy,
    the closed form ``z0 = -(ln(delta) + ln Gamma(alpha))``, refined by
    iterating the tail asymptote ``Q(alpha, z) ~ z**(alpha-1) e**-z /
    Gamma(alpha)``, i.e. ``z = z0 + (alpha - 1) ln z`` (the bare closed form
    is 20% high at alpha = 0.4, delta = 0.001; the refined one within 1%).
    Returns None when ``s <= 0``.
    """
    s = math.log(mean) - mean_log
    if not s > 0.0:
        return None
    alpha = (3.0 - s + math.sqrt((s - 3.0) ** 2 + 24.0 * s)) / (12.0 * s)
    beta = mean / alpha
    try:
        from scipy.special import gammainccinv
    except ImportError:  # optional dependency: fall back to the closed form
        z0 = -(math.log(delta) + math.lgamma(alpha))
        z = z0
        for _ in range(8):
            if z <= 0.0:
                return max(0.0, beta * z0)
            z = z0 + (alpha - 1.0) * math.log(z)
        return beta * max(z, 0.0)
    return beta * float(gammainccinv(alpha, delta))


# ------------------------------------------------------------------- helpers
def _device_ops(x):
    """The device twins of the selection kernels when ``x`` is a device array, else None."""
    if not backend_of(x).device:
        return None
    from . import _sparse_device

    return _sparse_device.OPS


def _count_above(x, t):
    """How many ``|x| > t`` (``t`` of x's dtype)."""
    ops = _device_ops(x)
    return ops.count_above(x, t) if ops else int(K.count_above(x, t))


def _threshold_for(x, thr):
    """Cast a float64 threshold to x's dtype so that ``|x| > result`` iff ``|x| > thr``."""
    t = x.dtype.type(thr)
    if float(t) > thr:
        t = np.nextafter(t, x.dtype.type(-np.inf))
    return t


def _select_above(x, thr):
    """Ascending indices with ``|x| > thr`` and their count, in two streaming passes."""
    t = _threshold_for(x, thr)
    ops = _device_ops(x)
    if ops:
        return ops.select_above(x, t)
    count = int(K.count_above(x, t))
    out = np.empty(count, dtype=np.int64)
    K.select_above(x, t, out)
    return out


def _top_k(x, k):
    """Exact top-k of ``|x|``: ascending indices, ties to the lower index, exact zeros left out."""
    n = x.size
    ops = _device_ops(x)
    if ops:
        return ops.top_k(x, k)
    if k <= 0 or n == 0:
        return np.empty(0, dtype=np.int64)
    if k >= n:
        return _select_above(x, 0.0)
    mag = np.abs(x)
    v = mag.dtype.type(np.partition(mag, n - k)[n - k])
    if v == 0:
        return _select_above(x, 0.0)  # fewer than k nonzeros: send them all
    quota = k - int(K.count_above(mag, v))
    out = np.empty(k, dtype=np.int64)
    K.take_top(mag, v, quota, out)
    return out


def _top_k_of(x, idx, k):
    """Exact top-k of ``|x[idx]|`` (``idx`` ascending), ascending, ties to the lower index."""
    if idx.size <= k:
        return idx
    return idx[_top_k(x[idx], k)]


def _layout(n, k, max_gap):
    """``(encoding, width, index bytes)`` of k indices of n elements whose largest gap is given.

    Bit-packed gaps unless absolute u32 indices are no larger; dense when the
    indices and values would not be smaller than the dense array.
    """
    width = int(max(max_gap, 0)).bit_length() if k else 0
    gap_words = (k * width + 31) // 32
    sparse_index_bytes = 4 * gap_words
    encoding = ENC_GAPS
    if width > 32:  # only possible beyond 2**32 elements
        encoding = ENC_DENSE
    elif gap_words >= k and n <= 1 << 32:
        encoding, width, sparse_index_bytes = ENC_ABSOLUTE, 32, 4 * k
    if encoding == ENC_DENSE or sparse_index_bytes + 4 * k >= 4 * n:
        return ENC_DENSE, 0, 0
    return encoding, width, sparse_index_bytes


def _reject(codec, msg):
    raise PayloadError(f"codec {codec.codec_id!r}: {msg}")


# ---------------------------------------------------------------- base class
class _SparseCodec(Codec):
    """Wire format and decoding shared by the sparsifying codecs.

    Subclasses implement :meth:`_select`, returning ascending int64 indices.
    """

    homomorphic = False
    error_feedback = True
    sparse = True
    device_twin = "ccl.codecs._sparse_cuda:SparseTwin"  # see ccl.codecs.device

    @property
    def bits_per_value(self):
        """Expected payload bits per value: a value and an index per kept element."""
        return 64.0 * self.density if self.density is not None else 32.0

    def _select(self, x, ctx):
        raise NotImplementedError

    def _encode(self, x, ctx):
        idx = self._select(x, ctx) if x.size else np.empty(0, dtype=np.int64)
        return self._body(x, idx)

    def _body(self, x, idx):
        n, k = x.size, idx.size
        with np.errstate(over="ignore"):  # reported by the flag below
            values = x[idx].astype(np.float32) if k < n else x.astype(np.float32)
        if x.dtype != np.float32 and not np.isfinite(values).all():
            return np.empty(0, np.uint8), FLAG_OVERFLOW
        encoding, width, sparse_index_bytes = _layout(n, k, int(K.max_gap(idx)) if k else 0)
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
        body = np.empty(BODY_HEAD_SIZE + sparse_index_bytes + 4 * k, dtype=np.uint8)
        body[:BODY_HEAD_SIZE] = np.frombuffer(
            _BODY_HEAD.pack(encoding, VALUES_F32, 0, k, width), dtype=np.uint8)
        index_part = body[BODY_HEAD_SIZE:BODY_HEAD_SIZE + sparse_index_bytes].view(np.uint32)
        if encoding == ENC_ABSOLUTE:
            index_part[:] = idx
        else:
            K.pack_gaps(idx, width, index_part)
        body[BODY_HEAD_SIZE + sparse_index_bytes:].view(np.float32)[:] = values
        return body, 0

    def _parse(self, header, body, ctx):
        """Validate a body (host or device array); return ``(encoding, k, width, index bytes)``."""
        n = header.n
        if body.size < BODY_HEAD_SIZE:
            _reject(self, f"body of {body.size} bytes is shorter than its "
                          f"{BODY_HEAD_SIZE}-byte head")
        encoding, value_format, reserved, k, width = _BODY_HEAD.unpack(
            body[:BODY_HEAD_SIZE].tobytes())
        if value_format != VALUES_F32:
            _reject(self, f"unknown value format {value_format}")
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
        if k > rest // 4:
            _reject(self, f"count {k} does not fit a body of {rest} bytes")
        if encoding == ENC_ABSOLUTE:
            if width != 32:
                _reject(self, f"absolute indices must be 32 bits wide, not {width}")
            index_bytes = 4 * k
        else:
            if width > 32:
                _reject(self, f"gap width {width} exceeds 32 bits")
            index_bytes = 4 * ((k * width + 31) // 32)
        if rest != index_bytes + 4 * k:
            _reject(self, f"body of {rest} bytes does not match {k} indices "
                          f"({index_bytes} bytes) and {k} values")
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
        values = _f32(body[BODY_HEAD_SIZE + index_bytes:])
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
class TopKCodec(_SparseCodec):
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
            self.density = _check_density(0.01 if density is None else density)
            self.k = None
        else:
            self.density = None
            self.k = _check_int(k, "k", 1)

    def _select(self, x, ctx):
        k = _k_for(self.density, x.size) if self.k is None else min(self.k, x.size)
        return _top_k(x, k)


# ------------------------------------------------------------------- SIDCo
class _HostFit:
    """The statistics a SIDCo fit reads, by the numba kernels (``_sparse_device`` on a GPU)."""

    @staticmethod
    def moments(x):
        return K.abs_moments(x)

    @staticmethod
    def log_moments(x):
        if x.dtype == np.float32:
            return K.abs_log_moments_f32(x, x.view(np.uint32))
        s1, s2 = K.abs_moments(x)
        slog, nnz = K.nonzero_log_sum(x)
        return s1, s2, slog, nnz

    @staticmethod
    def tail(x, t):
        """The magnitudes ``|x| > t`` in order, or None when fewer than two."""
        count = int(K.count_above(x, t))
        if count < 2:
            return None
        buf = np.empty(count + 1, dtype=x.dtype)
        return buf[:K.compact_above(x, t, buf)]

    @staticmethod
    def min(a):
        return float(a.min())

    @staticmethod
    def peak(x):
        return float(np.max(np.abs(x)))


_HOST_FIT = _HostFit()


_DELTA1 = 0.25          # first-stage ratio of multi-stage fits
_ADAPT_EVERY = 5        # Q: steps between stage adjustments
_ADAPT_TOLERANCE = 0.2  # epsilon_H = epsilon_L


@register_codec
class SIDCoCodec(_SparseCodec):
    """SIDCo: threshold from a sparsity-inducing distribution fitted to the magnitudes.

    Parameters
    ----------
    density : float
        Target fraction ``delta`` of elements to send, ``0 < density <= 1``
        (default 0.01).
    dist : {"exp", "gpareto", "gamma"}
        ``"exp"``: exponential (SIDCo-E), for Laplace-like gradients;
        ``"gpareto"``: generalized Pareto by moments (SIDCo-P), for heavier
        tails; ``"gamma"``: gamma first stage, generalized Pareto tail stages
        (SIDCo-GP), for magnitudes piled up near zero.
    stages : int
        Number of fitting stages ``M >= 1`` (default 1). With ``M > 1`` the
        first stage targets 25% and each later stage refits the tail above
        the previous threshold.
    adaptive : bool
        Adjust ``M`` per (key, chunk) every 5 steps from the achieved
        density (default False); the state is in :meth:`state_dict`.

    Notes
    -----
    The count can miss ``k = ceil(density*n)`` by a factor when the data do
    not follow the fitted law; above ``ceil(4k/3)`` the exact top-k of the
    selection is kept. Chunks under 1024 elements and chunks of constant
    magnitude use exact top-k. An all-zero chunk sends nothing.

    Examples
    --------
    >>> import numpy as np
    >>> from ccl.codecs import get_codec
    >>> codec = get_codec("sidco", density=0.01)
    >>> x = np.random.default_rng(0).laplace(size=100_000).astype(np.float32)
    >>> sent = int(np.count_nonzero(codec.decode(codec.encode(x))))
    >>> 300 < sent < 3000                # about 1% of the values, by a fitted threshold
    True
    """

    codec_id = "sidco"
    wire_id = 6
    encode_gbps, decode_gbps = 6.11, 12.68

    def __init__(self, density=0.01, dist="exp", stages=1, adaptive=False):
        self.density = _check_density(density)
        if dist not in ("exp", "gpareto", "gamma"):
            raise ValueError(f"dist must be 'exp', 'gpareto' or 'gamma', got {dist!r}")
        self.dist = dist
        self.stages = _check_int(stages, "stages", 1)
        if not isinstance(adaptive, (bool, np.bool_)):
            raise ValueError(f"adaptive must be True or False, got {adaptive!r}")
        self.adaptive = bool(adaptive)
        self._adapt = {}

    # -------------------------------------------------------- selection
    def _select(self, x, ctx):
        k = _k_for(self.density, x.size)
        if x.size < TINY or k >= x.size:
            return _top_k(x, k)
        stages = self._stages_for(ctx) if self.adaptive else self.stages
        thr = self._fit(x, k, stages)
        if thr is None:  # constant or all-zero magnitudes
            return _top_k(x, k)
        idx = _select_above(x, thr)
        if self.adaptive:
            self._record(ctx, idx.size / k)
        if idx.size > math.ceil(4 * k / 3):
            idx = _top_k_of(x, idx, k)
        return idx

    def threshold(self, x, stages=None):
        """The magnitude threshold encode would use on ``x`` (``|x| > threshold`` is sent).

        Parameters
        ----------
        x : numpy.ndarray
            A chunk (flattened).
        stages : int, optional
            Fitting stages (default: the configured ``stages``).

        Returns
        -------
        float or None
            The threshold, or None when encode falls back to exact top-k
            (tiny, constant or all-zero input).
        """
        x = self.check_input(x)
        k = _k_for(self.density, x.size)
        if x.size < TINY or k >= x.size:
            return None
        return self._fit(x, k, self.stages if stages is None else stages)

    def _fit(self, x, k, stages):
        ops = _device_ops(x) or _HOST_FIT
        n = x.size
        delta = k / n
        if stages > 1 and delta < _DELTA1:
            first, later = _DELTA1, (delta / _DELTA1) ** (1.0 / (stages - 1))
        else:
            first, later, stages = delta, 1.0, 1
        if self.dist == "gamma":
            s1, s2, slog, nnz = ops.log_moments(x)
        else:
            s1, s2 = ops.moments(x)
            nnz = n
        norm = math.sqrt(s2)
        if s1 == 0.0:
            return None
        if not 0.0 < norm < math.inf:  # float64 input beyond float64's square range
            return self._fit_rescaled(x, k, stages, ops)
        # moments of the normalized magnitudes a = |x|/||x|| (sum a**2 = 1)
        if self.dist == "gamma":
            # ln 0 is undefined: fit the nonzero magnitudes, aiming at the same count
            if nnz <= k:
                return 0.0
            mean = s1 / norm / nnz
            first_nz = min(first * n / nnz, 1.0)
            eta = gamma_threshold(mean, slog / nnz - math.log(norm), first_nz)
        else:
            mean = s1 / norm / n
            var = 1.0 / n - mean * mean
            if var <= _CONSTANT_RTOL * mean * mean:
                return None
            eta = (exp_threshold(mean, first) if self.dist == "exp"
                   else gpareto_threshold(mean, var, first))
        if eta is None:
            return None
        thr = eta * norm
        tail = x
        for _ in range(stages - 1):
            above = ops.tail(tail, _threshold_for(tail, thr))
            if above is None:
                break
            tail = above
            t1, t2 = ops.moments(tail)
            lo = ops.min(tail)
            mean = t1 / tail.size
            if self.dist == "exp":
                thr = lo + (mean - lo) * math.log(1.0 / later)
            else:
                var = max(t2 / tail.size - mean * mean, 0.0)
                shifted = gpareto_threshold(mean - lo, var, later)
                if shifted is None:  # an equal-valued tail: keep all of it
                    break
                thr = lo + shifted
        return thr

    def _fit_rescaled(self, x, k, stages, ops):
        peak = ops.peak(x)
        thr = self._fit(x / peak, k, stages)
        return None if thr is None else thr * peak

    # ------------------------------------------------- adaptive stages
    def _max_stages(self):
        return max(1, math.ceil(math.log2(1.0 / self.density)))

    def _state(self, ctx):
        key = (ctx.key, ctx.chunk)
        state = self._adapt.get(key)
        if state is None:
            state = {"stages": min(self.stages, self._max_stages()), "direction": 1,
                     "ratio_sum": 0.0, "steps": 0, "last_error": None}
            self._adapt[key] = state
        return state

    def _stages_for(self, ctx):
        return self._state(ctx)["stages"]

    def _record(self, ctx, ratio):
        """Accumulate ``k_actual/k``; every Q steps move ``M`` towards a ratio of 1.

        ``direction`` is the assumed sign of d(ratio)/dM: +1 (more stages
        select more) holds for light tails, -1 for heavier-than-exponential
        tails, where the reference rule walks the wrong way (see
        docs/codecs/sparse.md for measurements). It starts at +1, as the
        reference assumes, and flips (like the reference's ``stages=-2``
        mode) when ``|r - 1|`` got worse since the previous adjustment, or
        when the wanted step would leave ``[1, ceil(log2(1/density))]``:
        at a bound the other way is the only one that can change the ratio.
        """
        state = self._state(ctx)
        state["ratio_sum"] += ratio
        state["steps"] += 1
        if state["steps"] < _ADAPT_EVERY:
            return
        mean = state["ratio_sum"] / state["steps"]
        error = abs(mean - 1.0)
        if state["last_error"] is not None and error > state["last_error"]:
            state["direction"] = -state["direction"]
        step = 0
        if mean > 1.0 + _ADAPT_TOLERANCE:
            step = -state["direction"]
        elif mean < 1.0 - _ADAPT_TOLERANCE:
            step = state["direction"]
        if step and not 1 <= state["stages"] + step <= self._max_stages():
            state["direction"] = -state["direction"]
            step = -step
        state["stages"] = min(max(state["stages"] + step, 1), self._max_stages())
        state["last_error"] = error
        state["ratio_sum"] = 0.0
        state["steps"] = 0

    def state_dict(self):
        """The adaptive stage state, for checkpoints.

        Returns
        -------
        dict
            JSON-serialisable; :meth:`load_state_dict` restores it.
        """
        entries = []
        for (key, chunk), s in self._adapt.items():
            entries.append({"key": key if isinstance(key, (str, int, type(None))) else str(key),
                            "chunk": int(chunk), "stages": int(s["stages"]),
                            "direction": int(s["direction"]),
                            "ratio_sum": float(s["ratio_sum"]), "steps": int(s["steps"]),
                            "last_error": None if s["last_error"] is None
                            else float(s["last_error"])})
        return {"version": 1, "adaptive_stages": entries}

    def load_state_dict(self, state):
        """Restore what :meth:`state_dict` returned (replaces the current state).

        Parameters
        ----------
        state : dict
            A :meth:`state_dict` result.

        Raises
        ------
        ValueError
            If ``state`` is not in the format :meth:`state_dict` writes.
        """
        try:
            if state.get("version") != 1:
                raise ValueError(f"unsupported SIDCo state version {state.get('version')!r}")
            restored = {}
            for e in state["adaptive_stages"]:
                last = e["last_error"]
                restored[(e["key"], int(e["chunk"]))] = {
                    "stages": min(max(int(e["stages"]), 1), self._max_stages()),
                    "direction": 1 if int(e["direction"]) >= 0 else -1,
                    "ratio_sum": float(e["ratio_sum"]), "steps": int(e["steps"]),
                    "last_error": None if last is None else float(last)}
        except (AttributeError, KeyError, TypeError) as exc:
            raise ValueError(f"not a SIDCo state dict: {exc!r}") from None
        self._adapt = restored


# --------------------------------------------------------------------- DGC
_DGC_UPPER, _DGC_LOWER, _DGC_ITERS = 1.3, 0.8, 10


@register_codec
class DGCCodec(_SparseCodec):
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
        self.density = _check_density(density)
        if isinstance(sample_ratio, bool) or \
                not isinstance(sample_ratio, (int, float, np.floating, np.integer)) or \
                not 0.01 <= float(sample_ratio) <= 1.0:
            raise ValueError(f"sample_ratio must be a number in [0.01, 1], got {sample_ratio!r}")
        self.sample_ratio = float(sample_ratio)
        self.seed = _check_int(seed, "seed", 0)

    def _select(self, x, ctx):
        n = x.size
        k = _k_for(self.density, n)
        if k >= n:
            return _top_k(x, k)
        samples = self._sample(x, ctx)
        top = min(samples.size, max(1, math.ceil(samples.size * self.density)))
        thr = float(np.partition(samples, samples.size - top)[samples.size - top])
        for refinement in range(_DGC_ITERS + 1):
            count = _count_above(x, _threshold_for(x, thr))
            if count >= _DGC_LOWER * k or thr == 0.0 or refinement == _DGC_ITERS:
                break
            thr *= _DGC_LOWER
        idx = _select_above(x, thr)
        return _top_k_of(x, idx, k)

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
