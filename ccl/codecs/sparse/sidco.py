"""SIDCo: a sparsifier whose threshold comes from a distribution fitted to the magnitudes.

The wire format, decoding and the exact top-k it falls back on are those of
the sparse family (:class:`~ccl.codecs.sparse.SparseCodec`); this
module holds the closed-form threshold fits (exponential, generalized Pareto,
gamma), the multi-stage refinement and the per-key adaptation of the stage
count (SIDCo, Abdelmoniem et al., MLSys 2021; ``docs/codecs/sparse.md``).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from . import _kernels as K
from ..registry import register_codec
from ._common import (TINY, SparseCodec, check_density, check_int, count_above, device_ops,
                      select_above, target_count, threshold_for, top_k, top_k_of)

__all__ = ["SIDCoCodec", "exp_threshold", "gpareto_threshold", "gamma_threshold"]

# Magnitudes whose variance is below this fraction of their squared mean are
# treated as constant: no fit is meaningful, exact top-k decides.
_CONSTANT_RTOL = 1e-9


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


class _HostFit:
    """The statistics a SIDCo fit reads, by the numba kernels (``_cuda.OPS`` on a GPU)."""

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
# a fit that selects fewer than this fraction of k is replaced by the exact top-k
_FALLBACK_LOW = 1.0 - _ADAPT_TOLERANCE
_FALLBACK_HALVINGS = 8  # then exact top-k over the whole chunk


@register_codec
class SIDCoCodec(SparseCodec):
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
        Number of fitting stages ``M >= 1`` (default 1), the starting value
        when ``adaptive``. With ``M > 1`` the first stage targets 25% and
        each later stage refits the tail above the previous threshold.
    adaptive : bool
        Adjust ``M`` per (key, chunk) every 5 steps from the achieved
        density, within ``[1, ceil(log2(1/density))]`` (default True, as
        SIDCo runs); the state is in :meth:`state_dict`. ``False`` keeps
        ``M = stages`` fixed.

    Notes
    -----
    The fitted count can miss ``k = ceil(density*n)`` by a factor when the
    data do not follow the fitted law, and under error feedback the input
    is mostly residual, which no gradient law describes. Two bounds keep
    the selection near ``k``: above ``ceil(4k/3)`` the exact top-k of the
    selection is kept; below ``0.8k`` the threshold is halved until it
    passes ``k`` values (a counting pass each, at most 8 times, then the
    exact top-k of the chunk) and the exact top-k of those is sent. So a
    chunk sends between ``0.8k`` and ``ceil(4k/3)`` values (fewer only when
    fewer are nonzero), and a held residual is delivered when the
    gradients stop. Chunks under 1024 elements and chunks of constant
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

    def __init__(self, density: float = 0.01, dist: str = "exp", stages: int = 1,
                 adaptive: bool = True) -> None:
        self.density = check_density(density)
        if dist not in ("exp", "gpareto", "gamma"):
            raise ValueError(f"dist must be 'exp', 'gpareto' or 'gamma', got {dist!r}")
        self.dist = dist
        self.stages = check_int(stages, "stages", 1)
        if not isinstance(adaptive, (bool, np.bool_)):
            raise ValueError(f"adaptive must be True or False, got {adaptive!r}")
        self.adaptive = bool(adaptive)
        self._adapt = {}

    # -------------------------------------------------------- selection
    def _select(self, x, ctx):
        k = target_count(self.density, x.size)
        if x.size < TINY or k >= x.size:
            return top_k(x, k)
        stages = self._stages_for(ctx) if self.adaptive else self.stages
        thr = self._fit(x, k, stages)
        if thr is None:  # constant or all-zero magnitudes
            return top_k(x, k)
        idx = select_above(x, thr)
        if self.adaptive:
            self._record(ctx, idx.size / k)
        if idx.size < _FALLBACK_LOW * k:
            return self._fallback(x, k, thr)
        if idx.size > math.ceil(4 * k / 3):
            idx = top_k_of(x, idx, k)
        return idx

    @staticmethod
    def _fallback(x, k, thr):
        """The exact top-k when the fitted threshold ``thr`` selects too few.

        Under error feedback the input is dominated by the residual, whose
        magnitudes pile up below the last threshold: a fit made for a
        gradient's tail then reads a threshold far above the data and the
        residual would stay held (none of it delivered). Halving ``thr``
        until it passes ``k`` values costs a counting pass each; the top-k of
        those candidates is then the exact top-k of ``x``. After a bounded
        number of halvings the exact top-k is taken directly.
        """
        for _ in range(_FALLBACK_HALVINGS):
            thr *= 0.5
            if count_above(x, threshold_for(x, thr)) >= k:
                return top_k_of(x, select_above(x, thr), k)
        return top_k(x, k)

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
        k = target_count(self.density, x.size)
        if x.size < TINY or k >= x.size:
            return None
        return self._fit(x, k, self.stages if stages is None else stages)

    def _fit(self, x, k, stages):
        ops = device_ops(x) or _HOST_FIT
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
            above = ops.tail(tail, threshold_for(tail, thr))
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

    def state_dict(self) -> dict[str, Any]:
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

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
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

