"""Device versions of the selections and fit statistics of the sparse codecs.

Array-module code (``cupy`` on a GPU), no numba.cuda: :mod:`._common` asks
for :data:`OPS` when its input is a device array, so the same selection
code runs on both. Selections (``count_above``, ``select_above``,
``top_k``) are exact, so top-k and DGC choose the CPU's elements. The SIDCo
fit's moments are float64 sums in another order than the CPU's (and ``log``
instead of its polynomial), so a SIDCo threshold can differ in its last
bits and, rarely, select one element more or fewer near the threshold.
"""

import numpy as np

from ..._xp import backend_of

__all__ = ["SparseOps", "OPS"]


class SparseOps:
    """The device twins of ``sparse``'s selection kernels and of ``_HostFit``."""

    @staticmethod
    def _xp(x):
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


OPS = SparseOps()
