"""Exact top-k (``topk``) and DGC (``dgc``): the two sparsifiers that choose by magnitude.

:class:`TopKCodec` takes the exact ``k`` largest magnitudes of each chunk;
:class:`DGCCodec` estimates a threshold from a strided sample (Deep Gradient
Compression) and keeps at most ``k``. Both send the wire format of
:class:`~ccl.codecs.sparse.SparseCodec` (``docs/codecs/sparse.md``).
"""

from __future__ import annotations

import math

import numpy as np

from ..registry import register_codec
from ._common import (SparseCodec, check_density, check_int, count_above, select_above,
                      target_count, threshold_for, top_k, top_k_of)

__all__ = ["TopKCodec", "DGCCodec"]


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

    def __init__(self, density: float | None = None, k: int | None = None) -> None:
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

    def __init__(self, density: float = 0.01, sample_ratio: float = 0.01, seed: int = 0) -> None:
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
