"""The project-wide numba ``njit`` wrapper with ccl's house defaults.

Kernels release the GIL (``nogil=True``) so they can overlap MPI waits in
other threads. Caching is opt-in (``CCL_NUMBA_CACHE=1``) because concurrent
cache writes from many ranks can corrupt the cache (numba #4807); job
scripts point ``NUMBA_CACHE_DIR`` at node-local storage and warm it once
with :func:`ccl.warmup` before launching many ranks.
"""

import numba

from . import config

__all__ = ["njit", "prange", "cache_enabled"]

prange = numba.prange


def cache_enabled():
    """Return whether compiled kernels are cached on disk (``CCL_NUMBA_CACHE=1``)."""
    return bool(config.read("CCL_NUMBA_CACHE"))


def njit(func=None, **options):
    """``numba.njit`` with ``nogil=True`` and ``cache`` taken from ``CCL_NUMBA_CACHE``.

    Use bare (``@njit``) or with numba options (``@njit(parallel=True)``).
    """
    options.setdefault("nogil", True)
    options.setdefault("cache", cache_enabled())
    if func is None:
        return lambda f: numba.njit(**options)(f)
    return numba.njit(**options)(func)
