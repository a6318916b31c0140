"""Collective algorithms; each is one module with ``allreduce(call, x)``.

``ring``, ``tree``, ``direct`` and ``allgather`` are described in their
modules; ``auto`` (in :mod:`ccl.collectives.auto`) picks one.
"""

from . import allgather, auto, direct, ring, tree
from .base import Call, chunk_bounds

#: name -> module; the module's ``allreduce(call, x)`` returns the sum.
ALGORITHMS = {"ring": ring, "tree": tree, "direct": direct, "allgather": allgather}
#: algorithms that split the input into one chunk per rank
CHUNKED = frozenset({"ring", "direct"})
#: algorithms that offer ``reduce_scatter(call, x)``
REDUCE_SCATTER = frozenset({"ring", "direct"})

__all__ = ["ALGORITHMS", "CHUNKED", "REDUCE_SCATTER", "Call", "chunk_bounds", "auto"]
