"""The public collectives: ``compressed_allreduce``, ``reduce_scatter``, ``allgather``.

These are thin: each call ends in :func:`ccl.collectives.run`, which checks
that the ranks agree on the call (a rank with bad arguments raises its error,
every other rank a :class:`ccl.MismatchError`, never a hang), runs the
algorithm and shapes the result like the input. They keep the error-feedback
state of their keys on the communicator (freed with it); a
:class:`ccl.Communicator` (``ccl.communicator``) keeps its own, with its own
default options.

The array and the codec are positional, everything else keyword-only
(:mod:`ccl.arguments`); the defaults are those of
:class:`ccl.collectives.Options`, written once there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Hashable

from . import collectives
from ._xp import ArrayT
from .arguments import CodecLike, array_first, by_look, world_or
from .collectives import Options
from .communicator import Communicator
from .feedback import ErrorFeedback
from .transport import channel as _channel
from .transport import comm_cache

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["compressed_allreduce", "reduce_scatter", "allgather", "Communicator"]

# The module-level functions' defaults: one partition, compress everything.
_MODULE_OPTIONS = Options.make()

# The order the keyword arguments once had as positional ones: what an extra positional
# argument most likely meant (see ccl.arguments).
_ALLREDUCE_ORDER = ("comm", "op", "algorithm", "key", "check_finite", "timeout")
_ALLGATHER_ORDER = ("comm", "key", "check_finite", "timeout")


def _module_call(comm: MPI.Intracomm | None, collective: str, x: ArrayT, key: Hashable | None,
                 **options: Any) -> ArrayT:
    comm = world_or(comm)
    ch = _channel(comm)
    cache = comm_cache(comm)
    feedback = cache.get("feedback")  # made once, never replaced
    if feedback is None:
        with cache.lock:
            feedback = cache.setdefault("feedback", ErrorFeedback())
    return collectives.run(ch, feedback, collective, x, _MODULE_OPTIONS, key, **options)


@array_first(2, by_look(_ALLREDUCE_ORDER), "ccl.compressed_allreduce(x, codec")
def compressed_allreduce(x: ArrayT, codec: CodecLike = None, *, comm: MPI.Intracomm | None = None,
                         op: str = Options.op, algorithm: str = Options.algorithm,
                         key: Hashable | None = None, check_finite: bool = Options.check_finite,
                         timeout: float | None = None) -> ArrayT:
    """Sum (or average) an array over all ranks, compressing what is sent.

    Parameters
    ----------
    x : numpy.ndarray
        float32 (float64, float16 where the codec allows) array of any shape;
        the same shape and dtype on every rank.
    codec : Codec, str, dict or None
        The codec (see :func:`ccl.codecs.get_codec`); ``None`` is no
        compression: with ``algorithm="auto"`` the MPI library's own
        ``Allreduce``.
    comm : mpi4py.MPI.Intracomm, optional
        Defaults to ``MPI.COMM_WORLD``. ccl's traffic runs on a private
        duplicate cached on it.
    op : {"sum", "mean"}
        Sum or average over ranks (``mean`` divides once, at decode).
    algorithm : {"auto", "ring", "tree", "direct", "allgather", "hierarchical", "mpi"}
        How chunks travel (see the algorithms page). ``"auto"`` compresses
        where that beats ``MPI_Allreduce`` at the link speed, which it
        measures once per communicator unless ``CCL_LINK_GBPS`` gives it
        (see :mod:`ccl.collectives.auto`), and on nodes of several ranks
        runs ``hierarchical`` (exact inside a node, compressed across).
        ``ring`` and ``direct`` are pipelined in segments of
        ``CCL_SEGMENT_BYTES`` payload bytes.
    key : hashable, optional
        Names the tensor: error-feedback residuals and the step counter are
        kept per key (on the communicator) across calls.
    check_finite : bool
        Raise :class:`ccl.NonFiniteError` on every rank if any rank's input
        holds NaN or Inf. Otherwise non-finite chunks decode to NaN on every
        rank and residuals are left untouched.
    timeout : float, optional
        Seconds to wait for a peer before aborting the job with a message
        naming the collective (default: ``CCL_TIMEOUT``, else forever).

    Returns
    -------
    numpy.ndarray
        The sum (or mean), with ``x``'s shape and dtype, bitwise identical on
        every rank.

    Raises
    ------
    TypeError, ValueError
        Bad arguments (on the offending ranks; the others raise MismatchError).
    MismatchError
        Ranks passed different shapes, dtypes, codecs, ops or algorithms.
    NonFiniteError
        NaN/Inf input with ``check_finite=True``.
    CompressionOverflowError
        The compressed sum did not fit its format (e.g. fp16 above 65504).

    Examples
    --------
    >>> import numpy as np, ccl
    >>> from mpi4py import MPI
    >>> x = np.full(4, MPI.COMM_WORLD.rank + 1.0, dtype=np.float32)
    >>> y = ccl.compressed_allreduce(x, "fp16", algorithm="ring")
    >>> p = MPI.COMM_WORLD.size
    >>> float(y[0]) == p * (p + 1) / 2        # small integers are exact in fp16
    True
    """
    return _module_call(comm, "allreduce", x, key, codec=codec, op=op, algorithm=algorithm,
                        check_finite=check_finite, timeout=timeout)


@array_first(2, by_look(_ALLREDUCE_ORDER), "ccl.reduce_scatter(x, codec")
def reduce_scatter(x: ArrayT, codec: CodecLike = None, *, comm: MPI.Intracomm | None = None,
                   op: str = Options.op, algorithm: str = "ring", key: Hashable | None = None,
                   check_finite: bool = Options.check_finite,
                   timeout: float | None = None) -> ArrayT:
    """Sum an array over all ranks and return this rank's block of the result.

    The block is ``numpy.array_split(result.ravel(), comm.size)[comm.rank]``.
    Errors and semantics are those of :func:`compressed_allreduce`. The
    owner of a block keeps its exact sum (there is no final re-encode).

    Parameters
    ----------
    x : numpy.ndarray
        Array of any shape; the same shape and dtype on every rank.
    codec : Codec, str, dict or None
        The codec (see :func:`ccl.codecs.get_codec`).
    comm : mpi4py.MPI.Intracomm, optional
        Defaults to ``MPI.COMM_WORLD``.
    op : {"sum", "mean"}
        Sum or average over ranks.
    algorithm : {"ring", "direct", "auto"}
        The algorithm of the reduce-scatter phase.
    key : hashable, optional
        Names the tensor for error feedback (see :func:`compressed_allreduce`).
    check_finite : bool
        Raise :class:`ccl.NonFiniteError` on every rank for NaN/Inf input.
    timeout : float, optional
        Seconds to wait for a peer before aborting the job.

    Returns
    -------
    numpy.ndarray
        1-D block of ``x``'s dtype.

    Raises
    ------
    TypeError, ValueError
        Bad arguments (on the offending ranks; the others raise MismatchError).
    MismatchError
        Ranks passed different shapes, dtypes, codecs, ops or algorithms.
    NonFiniteError
        NaN/Inf input with ``check_finite=True``.

    Examples
    --------
    >>> import numpy as np, ccl
    >>> from mpi4py import MPI
    >>> blk = ccl.reduce_scatter(np.ones(10, np.float32), "fp16")
    >>> bool((blk == MPI.COMM_WORLD.size).all())
    True
    """
    return _module_call(comm, "reduce_scatter", x, key, codec=codec, op=op,
                        algorithm=algorithm, check_finite=check_finite, timeout=timeout)


@array_first(2, by_look(_ALLGATHER_ORDER), "ccl.allgather(block, codec")
def allgather(block: ArrayT, codec: CodecLike = None, *, comm: MPI.Intracomm | None = None,
              key: Hashable | None = None, check_finite: bool = Options.check_finite,
              timeout: float | None = None) -> ArrayT:
    """Gather every rank's block, compressed; return their 1-D concatenation in rank order.

    Blocks may differ in length (zero-length blocks included) but not in
    dtype. Each block is encoded once by its rank (with error feedback under
    ``key``) and decoded by every rank, so results agree bitwise.

    Parameters
    ----------
    block : numpy.ndarray
        This rank's block (flattened); the same dtype on every rank.
    codec : Codec, str, dict or None
        The codec (see :func:`ccl.codecs.get_codec`).
    comm : mpi4py.MPI.Intracomm, optional
        Defaults to ``MPI.COMM_WORLD``.
    key : hashable, optional
        Names the block for error feedback (see :func:`compressed_allreduce`).
    check_finite : bool
        Raise :class:`ccl.NonFiniteError` on every rank for NaN/Inf input.
    timeout : float, optional
        Seconds to wait for a peer before aborting the job.

    Returns
    -------
    numpy.ndarray
        1-D array of ``block``'s dtype.

    Raises
    ------
    TypeError, ValueError
        Bad arguments (on the offending ranks; the others raise MismatchError).
    MismatchError
        Ranks passed different dtypes or codecs.
    NonFiniteError
        NaN/Inf input with ``check_finite=True``.

    Examples
    --------
    >>> import numpy as np, ccl
    >>> from mpi4py import MPI
    >>> full = ccl.allgather(np.arange(3, dtype=np.float32), "none")
    >>> full.size == 3 * MPI.COMM_WORLD.size
    True
    """
    return _module_call(comm, "allgather", block, key, codec=codec, check_finite=check_finite,
                        timeout=timeout)
