"""THC lookup tables: the receiver table ``R`` and the sender tables ``Xtab``/``Ptab``.

The receiver table maps a b-bit index to an integer level in ``[0, g]``; the
level ``r`` stands for the value ``v(r) = (r - g/2) * inc`` with
``inc = 2T/g``, so levels 0 and g are the clamp ``-T`` and ``+T`` (in units of
``max_norm/sqrt(D)``). The optimal table minimises the expected variance of
unbiased rounding of a standard normal value on an ``S``-point grid over
``[-T, T]`` (docs/codecs/thc.md, "Tables"); it is found by dynamic programming over "last
chosen level" on the left half and mirrored.

Everything here works in *level units* ``u = y/inc + g/2``: grid point ``j``
sits at ``u_j = j*g/(S-1)``, an exact rational, so which interval a grid point
falls in is decided in integer arithmetic.

All tables are computed on first use and cached; they are small (at most
``2^bits`` levels and ``S`` grid points).
"""

import functools
from statistics import NormalDist

import numpy as np

__all__ = ["GRID_POINTS", "MAX_G", "clamp_t", "receiver_table", "sender_tables",
           "rounding_variance", "kernel_tables"]

GRID_POINTS = 1001  # S: fine grid points on [-T, T] (odd, so y = 0 is a grid point)
MAX_G = 1024        # the DP is O(2^bits * g^2); larger g buys nothing at 4 bits


@functools.lru_cache(maxsize=None)
def clamp_t(p):
    """Return the clamp ``T = Φ⁻¹(1 - p/2)`` for a two-sided clamp probability ``p``."""
    return NormalDist().inv_cdf(1.0 - p / 2.0)


def _grid(g, p):
    """Grid positions in level units and their normal weights (summing to 1)."""
    s = GRID_POINTS
    t = clamp_t(p)
    j = np.arange(s)
    y = -t + j * (2.0 * t / (s - 1))
    w = np.exp(-0.5 * y * y)
    return j * (g / (s - 1)), w / w.sum()


def _interval_costs(g, p):
    """Matrix ``C[a, b]`` = Σ w(u)(b - u)(u - a) over grid points with a <= u <= b.

    In level units (multiply by ``inc²`` for value units). Computed from
    prefix sums of w, w·u and w·u² over the grid; the grid points inside
    ``[a, b]`` are ``ceil(a(S-1)/g) .. floor(b(S-1)/g)``, found exactly in integers.
    """
    s = GRID_POINTS
    u, w = _grid(g, p)
    zero = np.zeros(1)
    c0 = np.concatenate([zero, np.cumsum(w)])
    c1 = np.concatenate([zero, np.cumsum(w * u)])
    c2 = np.concatenate([zero, np.cumsum(w * u * u)])
    levels = np.arange(g + 1)
    first = -((-levels * (s - 1)) // g)        # ceil(a(S-1)/g): first grid point >= level a
    last = (levels * (s - 1)) // g + 1         # one past the last grid point <= level b
    a = levels[:, None].astype(np.float64)
    b = levels[None, :].astype(np.float64)
    lo, hi = first[:, None], last[None, :]
    w0 = c0[hi] - c0[lo]
    w1 = c1[hi] - c1[lo]
    w2 = c2[hi] - c2[lo]
    cost = -w2 + (a + b) * w1 - a * b * w0
    # only a < b is an interval; points on a level cost nothing, so tiny negatives are rounding
    return np.where(b > a, np.maximum(cost, 0.0), np.inf)


@functools.lru_cache(maxsize=None)
def _optimal_table(q, g, p):
    half = q // 2
    cost = _interval_costs(g, p)
    # best[r]: least cost of the left intervals when the last chosen level is r;
    # choice[k][r]: the level before r at step k (for backtracking)
    best = np.full(g + 1, np.inf)
    best[0] = 0.0
    choice = []
    for _ in range(half - 1):
        total = best[:, None] + cost            # [previous level, next level]
        prev = np.argmin(total, axis=0)          # argmin takes the lowest level on ties
        best = total[prev, np.arange(g + 1)]
        choice.append(prev)
    # the middle interval [r, g - r] must straddle g/2 without touching it: r < g/2
    mids = np.arange((g + 1) // 2)
    total = 2.0 * best[mids] + cost[mids, g - mids]
    level = int(np.argmin(total))
    left = [level]
    for prev in reversed(choice):
        level = int(prev[level])
        left.append(level)
    left.reverse()
    return tuple(left + [g - r for r in reversed(left)])


@functools.lru_cache(maxsize=None)
def _uniform_table(q, g):
    # evenly spaced, rounded half up on the left half and mirrored so it stays symmetric
    left = [int(np.floor(i * g / (q - 1) + 0.5)) for i in range(q // 2)]
    return tuple(left + [g - r for r in reversed(left)])


def receiver_table(bits, g, p, table="optimal"):
    """Return the receiver table ``R`` (a tuple of ``2^bits`` increasing ints, 0 to g).

    Parameters
    ----------
    bits : int
        Index width; the table has ``q = 2^bits`` entries.
    g : int
        Table granularity: levels are integers in ``[0, g]``, ``g >= q - 1``.
    p : float
        Two-sided clamp probability (sets ``T``, hence the weights of the DP).
    table : {"optimal", "uniform"}
        ``"optimal"``: the dynamic programme above; ``"uniform"``: levels
        ``round(i*g/(q-1))`` (exact when ``q - 1`` divides ``g``).

    Returns
    -------
    tuple of int
        Symmetric (``R[i] + R[q-1-i] == g``), strictly increasing, ``R[0] == 0``.
    """
    q = 1 << bits
    if table == "uniform":
        return _uniform_table(q, g)
    return _optimal_table(q, g, float(p))


def rounding_variance(levels, g, p):
    """Expected variance of unbiased rounding of N(0,1) on the grid to ``levels`` (value units)."""
    cost = _interval_costs(g, p)
    inc = 2.0 * clamp_t(p) / g
    return float(sum(cost[a, b] for a, b in zip(levels[:-1], levels[1:])) * inc * inc)


@functools.lru_cache(maxsize=None)
def sender_tables(levels, g):
    """Return ``(xtab, ptab)``: the sender tables of THC on the ``S``-point grid.

    ``xtab[j]`` (uint8) is the largest ``i <= q - 2`` with ``R[i] <= u_j``;
    the encoder sends ``xtab[j] + 1`` with probability ``ptab[j]`` (float64)
    ``= (u_j - R[i]) / (R[i+1] - R[i])``, else ``xtab[j]``, so the expected
    level is ``u_j`` (unbiased). At the top grid point ``ptab = 1``.
    The cached arrays are shared: do not modify them.
    """
    s = GRID_POINTS
    levels_arr = np.asarray(levels, dtype=np.int64)
    q = levels_arr.size
    j = np.arange(s, dtype=np.int64)
    # R[i] <= j*g/(S-1)  <=>  R[i]*(S-1) <= j*g, exactly in integers
    i = np.searchsorted(levels_arr * (s - 1), j * g, side="right") - 1
    i = np.minimum(i, q - 2)
    lo, hi = levels_arr[i], levels_arr[i + 1]
    ptab = (j * g - lo * (s - 1)) / ((s - 1) * (hi - lo)).astype(np.float64)
    return i.astype(np.uint8), ptab


@functools.lru_cache(maxsize=None)
def kernel_tables(levels, g):
    """Sender tables as the encode kernel uses them: ``(xk, thr)``.

    Index ``xk[j] + 1`` is sent when a uniform 32-bit word is below
    ``thr[j] = round(ptab[j] * 2^32)`` (uint32). A probability of 1 (only the
    top grid point) does not fit 32 bits, so there ``xk`` is ``q - 1`` with
    probability 0: the same distribution. Writable on purpose (numba handles
    read-only arrays much more slowly); do not modify.
    """
    xtab, ptab = sender_tables(levels, g)
    thr = np.rint(ptab * 2.0**32)
    full = thr >= 2.0**32
    xk = xtab + full.astype(np.uint8)
    return xk, np.where(full, 0.0, thr).astype(np.uint32)
