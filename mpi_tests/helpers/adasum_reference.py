"""A float64 reference for Adasum: the pairwise tree of whole vectors, computed locally.

Ranks ``r >= p2`` (``p2`` the largest power of two not above the size) are
folded into rank ``r - p2`` first; then pairs of neighbours combine, the
lower rank's vector first, until one vector is left.
"""

import numpy as np

from ccl.torch.adasum import adasum_pair


def adasum_tree(vectors):
    """The Adasum of ``vectors`` (one per rank, in rank order)."""
    vectors = [np.asarray(v, dtype=np.float64) for v in vectors]
    power = 1 << (len(vectors).bit_length() - 1)
    level = [adasum_pair(vectors[r], vectors[r + power]) if r + power < len(vectors)
             else vectors[r] for r in range(power)]
    while len(level) > 1:
        level = [adasum_pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]
