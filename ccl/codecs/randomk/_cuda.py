"""Device twin of the ``randomk`` codec (see :mod:`.codec`): Floyd's draws in parallel.

The indices are the CPU's (:func:`randomk_indices`): every draw of Floyd's
algorithm depends only on the seed and its step, so all are drawn at once,
and which of them fell back to ``j`` is resolved without the serial loop.
"""

import numpy as np
from numba import cuda

from .._cuda_common import empty_body, launch, put, scatter, uniform_below
from ..context import all_finite
from ..device import DeviceTwin, body_buffer
from ..header import FLAG_OVERFLOW
from .codec import _BODY

__all__ = ["RandomKTwin", "randomk_indices"]


@cuda.jit
def floyd_draws(seed, first, t, seen):
    """Draw c of Floyd's algorithm: ``t[c]`` uniform in ``[0, first + c]``; ``seen``: first draws.

    Floyd's pick at step c is ``t[c]`` unless ``t[c]`` is already taken, in
    which case it is ``j = first + c``. Which draws were taken is decided by
    :func:`floyd_mark` from these draws alone, in parallel.
    """
    for c in range(cuda.grid(1), t.size, cuda.gridsize(1)):
        draw = uniform_below(seed, c, np.uint64(first + c) + np.uint64(1))
        t[c] = np.int64(draw)
        cuda.atomic.min(seen, draw, np.uint32(c))


@cuda.jit
def floyd_mark(t, seen, first, mask):
    """Mark Floyd's picks in ``mask`` (one byte per candidate).

    Every draw ends up in the set. Step c also adds ``j_c = first + c``
    ("falls back") when ``t[c]`` was taken before step c: drawn by an earlier
    step, or equal to ``j_c'`` of an earlier step c' that fell back. That
    recursion runs down the chain c -> t[c] - first, which strictly decreases.
    """
    for c in range(cuda.grid(1), t.size, cuda.gridsize(1)):
        mask[t[c]] = 1
        cur = c
        while True:
            v = t[cur]
            if seen[v] < np.uint32(cur):  # drawn by an earlier step
                mask[first + c] = 1
                break
            prev = v - first
            if prev < 0 or prev >= cur:  # below the j range, or t == j itself
                break
            cur = prev


@cuda.jit
def gather(x, idx, factor, scaled, out):
    """``out[i] = x[idx[i]]`` (times ``factor`` when scaled) in float32."""
    for i in range(cuda.grid(1), idx.size, cuda.gridsize(1)):
        if scaled:
            out[i] = np.float64(x[idx[i]]) * factor  # float64 product, as numba types it
        else:
            out[i] = x[idx[i]]


def randomk_indices(seed, d, k, be):
    """Device twin of :func:`ccl.codecs.randomk.randomk_indices` (the same sorted indices).

    Floyd's draws are independent given the seed; which of them fell back
    to ``j`` is resolved in parallel (:func:`floyd_mark`), and the chosen
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
        launch(be, floyd_draws, m, np.uint64(seed), d - m, t, seen)
        launch(be, floyd_mark, m, t, seen, d - m, mask)
    chosen = mask == 0 if invert else mask != 0
    return xp.flatnonzero(chosen).astype(np.int64)


class RandomKTwin(DeviceTwin):
    """``randomk`` on the device: the CPU's indices and bytes."""

    @staticmethod
    def encode(codec, x, ctx, be):
        d = x.size
        k = codec.count(d)
        seed = ctx.seed(codec.seed)
        idx = randomk_indices(seed, d, k, be)
        body = body_buffer(be, _BODY.size + 4 * k)
        put(be, body[:_BODY.size], codec._body_head(k, seed, d))
        values = body[_BODY.size:].view(np.float32)
        if not k:
            return body, 0
        launch(be, gather, k, x, idx, d / k, bool(codec.scale), values)
        if (x.dtype != np.float32 or codec.scale) and not all_finite(values):
            return empty_body(be), FLAG_OVERFLOW
        return body, 0

    @staticmethod
    def decode(codec, header, body, ctx, be):
        k, values, seed = codec._parse_for(header, body, ctx)
        out = be.xp.zeros(header.n, dtype=np.float32)
        if k:
            idx = randomk_indices(seed, header.n, k, be)
            launch(be, scatter, k, values, idx, out)
        return out

    @staticmethod
    def add(codec, ha, a_body, hb, b_body, ctx, be):
        # the CPU code is array-agnostic: ufuncs dispatch to the device and pack() builds
        # a device payload from a device body
        return codec._add(ha, a_body, hb, b_body, ctx)
