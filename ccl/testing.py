"""Test oracles for programs built on ccl, in the manner of :mod:`numpy.testing`.

An MPI test of a collective needs an exact reference and a check that every
rank holds the same result. These functions give both without trusting the
code under test: every rank can rebuild every other rank's input
(:func:`rank_input`), so the exact float64 sum (:func:`exact_sum`) needs no
communication, and :func:`assert_same_on_all_ranks` compares digests of the
result's bytes (replica consistency is bitwise, NaN patterns included).
:func:`cast_bound` and :func:`conservation_tolerance` are the error bounds the
test suite and ``python -m ccl.tools.soak`` hold the codecs to.

Nothing here is pickled: the digests travel as ``int64`` buffers.
"""

from __future__ import annotations

import zlib
from typing import Any, Mapping

import numpy as np

__all__ = ["CAST_ROUNDING", "CAST_SUBNORMAL", "assert_same_on_all_ranks", "cast_bound",
           "conservation_tolerance", "exact_sum", "rank_input", "same_on_all_ranks"]

EPS32 = float(np.finfo(np.float32).eps)
#: Unit roundoff of the codecs without error feedback, relative to the values rounded.
CAST_ROUNDING: Mapping[str, float] = {"none": EPS32 / 2, "fp16": 2.0**-11, "bf16": 2.0**-8}
#: ... and the absolute rounding of their subnormals (fp16's start below 6.1e-5).
CAST_SUBNORMAL: Mapping[str, float] = {"fp16": 2.0**-25}


def rank_input(rank: int, n: int, seed: int = 0, dtype: Any = np.float32,
               step: int = 0) -> np.ndarray:
    """Rank ``rank``'s input of ``n`` standard normal values: any rank can rebuild any other's.

    Parameters
    ----------
    rank : int
        The rank whose input to make.
    n : int
        Number of values.
    seed : int, optional
        Seed of the test; inputs of different seeds are independent.
    dtype : numpy dtype, optional
        Type of the values (float32 by default).
    step : int, optional
        Step of a multi-step test: each step draws new values.

    Returns
    -------
    numpy.ndarray
        1-D array of ``n`` values of ``dtype``, the same on every process that asks.

    Examples
    --------
    >>> from ccl.testing import rank_input
    >>> x = rank_input(1, 4, seed=3)
    >>> x.dtype, x.shape
    (dtype('float32'), (4,))
    >>> bool((x == rank_input(1, 4, seed=3)).all())
    True
    """
    rng = np.random.default_rng([seed, step, rank, n])
    return rng.standard_normal(n).astype(dtype)


def exact_sum(size: int, n: int, seed: int = 0, dtype: Any = np.float32,
              step: int = 0) -> np.ndarray:
    """The float64 sum of :func:`rank_input` over ranks 0 to ``size - 1``.

    Parameters
    ----------
    size : int
        Number of ranks (the communicator's size).
    n, seed, dtype, step
        As for :func:`rank_input`.

    Returns
    -------
    numpy.ndarray
        1-D float64 array of ``n`` values: the reference an allreduce of
        ``rank_input(comm.rank, n, ...)`` is compared with.

    Examples
    --------
    >>> import numpy as np
    >>> from mpi4py import MPI
    >>> import ccl
    >>> from ccl.testing import exact_sum, rank_input
    >>> comm = MPI.COMM_WORLD
    >>> y = ccl.compressed_allreduce(rank_input(comm.rank, 100), None, comm=comm,
    ...                              algorithm="ring")
    >>> bool(np.allclose(y, exact_sum(comm.size, 100), rtol=1e-5, atol=1e-5))
    True
    """
    total = np.zeros(n, dtype=np.float64)
    for r in range(size):
        total += rank_input(r, n, seed, dtype, step)
    return total


def _digests(comm: Any, array: np.ndarray) -> np.ndarray:
    """Every rank's ``(digest of the bytes, digest of shape and dtype)``, one row per rank."""
    data = np.ascontiguousarray(array)
    mine = np.array([zlib.crc32(data.view(np.uint8).tobytes()),
                     zlib.crc32(f"{data.shape} {data.dtype}".encode())], np.int64)
    every = np.empty((comm.size, 2), np.int64)
    comm.Allgather(mine, every)
    return every


def same_on_all_ranks(comm: Any, array: np.ndarray) -> bool:
    """Whether ``array`` is bitwise identical on every rank of ``comm`` (shape and dtype too).

    A collective call: every rank of ``comm`` must make it.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The communicator whose ranks compare their arrays.
    array : numpy.ndarray
        This rank's array.

    Returns
    -------
    bool
        The same answer on every rank.

    Examples
    --------
    >>> import numpy as np
    >>> from mpi4py import MPI
    >>> from ccl.testing import same_on_all_ranks
    >>> comm = MPI.COMM_WORLD
    >>> same_on_all_ranks(comm, np.arange(3.0))
    True
    >>> same_on_all_ranks(comm, np.full(3, np.nan))  # NaN compares by its bits
    True
    >>> same_on_all_ranks(comm, np.arange(3.0) * comm.rank) == (comm.size == 1)
    True
    """
    every = _digests(comm, array)
    return bool((every == every[0]).all())


def assert_same_on_all_ranks(comm: Any, array: np.ndarray) -> None:
    """Raise ``AssertionError`` on every rank unless ``array`` is the same on every rank.

    The check of replica consistency, as :func:`same_on_all_ranks` compares
    (bitwise, NaN patterns, shape and dtype included), made by every rank.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Every rank of it calls this function.
    array : numpy.ndarray
        The result this rank holds.

    Raises
    ------
    AssertionError
        On every rank, listing each rank's digests, when any rank differs.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> import ccl
    >>> from ccl.testing import assert_same_on_all_ranks, rank_input
    >>> comm = MPI.COMM_WORLD
    >>> y = ccl.compressed_allreduce(rank_input(comm.rank, 1000), "3lc", comm=comm)
    >>> assert_same_on_all_ranks(comm, y)
    """
    every = _digests(comm, array)
    if not (every == every[0]).all():
        rows = ", ".join(f"rank {r}: {d:#010x}/{s:#010x}" for r, (d, s) in enumerate(every))
        raise AssertionError(f"results differ across ranks (data/shape digests): {rows}")


def cast_bound(codec_id: str, exact: np.ndarray, inputs_abs_sum: Any, p: int) -> np.ndarray:
    """Largest error of a sum through a codec without error feedback, element by element.

    ``p + 1`` roundings of partial sums, each at most the codec's unit
    roundoff (:data:`CAST_ROUNDING`) plus float32's relative to the values
    rounded, plus the absolute rounding of subnormals (:data:`CAST_SUBNORMAL`).

    Parameters
    ----------
    codec_id : str
        ``"none"``, ``"fp16"`` or ``"bf16"``.
    exact : numpy.ndarray
        The exact (float64) sum.
    inputs_abs_sum : numpy.ndarray or float
        Sum over ranks of the inputs' absolute values (bounds every partial sum).
    p : int
        Number of ranks.

    Returns
    -------
    numpy.ndarray
        The bound, ``exact``'s shape: ``abs(result - exact) <= bound`` must hold.

    Examples
    --------
    >>> import numpy as np
    >>> from ccl.testing import cast_bound
    >>> exact = np.array([3.0, -1.0])
    >>> bound = cast_bound("fp16", exact, np.array([3.0, 1.0]), p=2)
    >>> bool((np.abs(exact.astype(np.float16) - exact) <= bound).all())
    True
    """
    unit = CAST_ROUNDING[codec_id]
    return (p + 1) * ((unit + EPS32) * (np.abs(exact) + inputs_abs_sum)
                      + CAST_SUBNORMAL.get(codec_id, 0.0))


def conservation_tolerance(calls: int, p: int, magnitude: float) -> float:
    """Float32 rounding allowed in ``delivered + held - put in`` after ``calls`` keyed calls.

    Error feedback loses nothing: over any number of calls, what was
    delivered plus the residuals still held equals what was put in, to float
    rounding. Each call rounds at most about ``4 (p + 1)`` times (error
    feedback's ``x + e`` and ``p - decode``, relay partial sums, the float32
    result) on values no larger than ``magnitude``.

    Parameters
    ----------
    calls : int
        Number of calls under the key.
    p : int
        Number of ranks.
    magnitude : float
        Largest absolute value of the sums and residuals involved.

    Returns
    -------
    float
        The absolute tolerance.

    Examples
    --------
    >>> from ccl.testing import conservation_tolerance
    >>> conservation_tolerance(10, 3, 1.0) < 1e-4
    True
    """
    return calls * 4 * (p + 1) * EPS32 * magnitude
