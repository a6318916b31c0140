"""Collective algorithms, and the planning that runs them.

Each algorithm is one module (``mpi``, ``ring``, ``tree``, ``direct``,
``allgather``; see :mod:`ccl.collectives.algorithms`) written against
:class:`~ccl.collectives.base.Call`; ``auto`` (:mod:`ccl.collectives.auto`)
picks one, from the link profile of :mod:`ccl.collectives.link`.
:func:`~ccl.collectives.plan.run` validates a call, agrees on it with the
other ranks, splits it and dispatches the pieces;
:class:`~ccl.collectives.options.Options` holds a call's options.
"""

from . import auto, link
from .algorithms import (ALGORITHM_NAMES, ALGORITHMS, CHUNKED, COLLECTIVES, OPS,
                         REDUCE_SCATTER)
from .base import Call, chunk_bounds
from .options import Options
from .plan import run

__all__ = ["ALGORITHMS", "ALGORITHM_NAMES", "CHUNKED", "COLLECTIVES", "OPS", "REDUCE_SCATTER",
           "Call", "Options", "chunk_bounds", "run", "auto", "link"]
