"""Device versions of the selections and fit statistics of the sparse codecs.

Array-module code (``cupy`` on a GPU) around the selection kernels of
:mod:`._cuda`: :mod:`._common` asks for :data:`OPS` when its input is a
device array, so the same selection code runs on both. Selections
(``count_above``, ``select_above``, ``top_k``) are exact, so top-k and DGC
choose the CPU's elements. The SIDCo fit's moments are float64 sums in
another order than the CPU's (and ``log`` instead of its polynomial), so a
SIDCo threshold can differ in its last bits and, rarely, select one element
more or fewer near the threshold.
"""

import math

import numpy as np

from ..._xp import backend_of

#: Inputs of at least this many elements find top-k's threshold among the elements above
#: a bound taken from a sample, instead of partitioning all of them.
SAMPLED_TOP_K = 1 << 18
_SAMPLE = 1 << 14

__all__ = ["SparseOps", "OPS"]


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
        from ._cuda import count_above

        return count_above(x, t, backend_of(x))

    def select_above(self, x, t):
        from ._cuda import compact_above

        return compact_above(x, t, backend_of(x))

    def top_k(self, x, k):
        """Exact top-k of ``|x|``, ascending, ties to the lower index, zeros left out.

        A large input is first cut down to the elements at or above a bound
        that a strided sample puts a little below the k-th largest (checked:
        when fewer than k are left, all of them are taken); the k-th largest
        is then found among those alone. On an H100, partitioning all of a
        256 MB input was most of a 6 ms top-k encode.
        """
        from ._cuda import compact_above

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
