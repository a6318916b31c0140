"""The names of ccl's operations, collectives and algorithms, and the algorithm modules.

Every algorithm is one module of this package with ``allreduce(call, x)``,
optionally ``reduce_scatter(call, x)``, and ``CHUNKED`` (whether it cuts the
input into one chunk per rank). ``auto`` chooses among them
(:mod:`ccl.collectives.auto`).

>>> from ccl.collectives.algorithms import ALGORITHM_NAMES, REDUCE_SCATTER
>>> ALGORITHM_NAMES
('auto', 'mpi', 'ring', 'tree', 'direct', 'allgather', 'hierarchical')
>>> sorted(REDUCE_SCATTER)
['direct', 'ring']
"""

from . import allgather, direct, hierarchical, mpi, ring, tree

__all__ = ["OPS", "COLLECTIVES", "ALGORITHMS", "ALGORITHM_NAMES", "FLAT", "CHUNKED",
           "REDUCE_SCATTER"]

#: Reduction operations: ``mean`` divides the sum by the rank count once.
OPS = ("sum", "mean")
#: The collectives.
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")
#: name -> module, in the order the docs list them.
ALGORITHMS = {"mpi": mpi, "ring": ring, "tree": tree, "direct": direct, "allgather": allgather,
              "hierarchical": hierarchical}
#: Every name an ``algorithm=`` argument accepts.
ALGORITHM_NAMES = ("auto",) + tuple(ALGORITHMS)
#: The algorithms that treat every rank alike (what hierarchical runs across nodes).
FLAT = tuple(name for name in ALGORITHMS if name != "hierarchical")
#: Algorithms that split the input into one chunk per rank.
CHUNKED = frozenset(name for name, module in ALGORITHMS.items() if module.CHUNKED)
#: Algorithms that offer ``reduce_scatter(call, x)``.
REDUCE_SCATTER = frozenset(name for name, module in ALGORITHMS.items()
                           if hasattr(module, "reduce_scatter"))
