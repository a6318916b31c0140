"""Exceptions raised by ccl.

Every collective raises the same exception class on every rank, so a
``try``/``except`` around a collective never leaves some ranks blocked.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CCLError",
    "PayloadError",
    "MismatchError",
    "NonFiniteError",
    "CompressionOverflowError",
    "LaunchError",
    "PeerError",
]


class CCLError(Exception):
    """Base class of every ccl-specific error.

    Catch it to handle any failure of a collective; every rank raises alike.

    Examples
    --------
    >>> import numpy as np, ccl
    >>> try:
    ...     ccl.codecs.get_codec("fp16").decode(np.zeros(3, np.uint8))
    ... except ccl.CCLError as exc:
    ...     print(type(exc).__name__)
    PayloadError
    """


class PayloadError(CCLError, ValueError):
    """A payload is malformed, truncated, or was made by another codec.

    Also a ``ValueError``.

    Examples
    --------
    >>> import numpy as np
    >>> from ccl.codecs import get_codec
    >>> payload = get_codec("fp16").encode(np.ones(4, np.float32))
    >>> get_codec("bf16").decode(payload)
    Traceback (most recent call last):
    ...
    ccl.errors.PayloadError: payload was made by codec 'fp16', not 'bf16'
    """


class MismatchError(CCLError):
    """Ranks disagree on shape, dtype, codec, algorithm, op or collective.

    Raised on every rank of the communicator. ``field`` names what differs
    and ``ranks`` groups the ranks by the value they passed.

    Parameters
    ----------
    message : str
        What differs and which ranks passed what.
    field : str, optional
        The argument that differs (``"shape"``, ``"codec"``, ...).
    ranks : list or dict, optional
        Groups of ranks that passed the same value.

    Examples
    --------
    On every rank of a job where rank 0 passed a 3-element array and the
    others 4 elements, ``ccl.compressed_allreduce(x, "fp16")`` raises:

    >>> from ccl import MismatchError
    >>> err = MismatchError("ranks disagree on the shape of allreduce", field="shape",
    ...                     ranks=[[0], [1, 2, 3]])
    >>> err.field, err.ranks
    ('shape', [[0], [1, 2, 3]])
    """

    def __init__(self, message: str, field: str | None = None,
                 ranks: list[list[int]] | dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.ranks = ranks


class NonFiniteError(CCLError, FloatingPointError):
    """NaN or Inf input with ``check_finite=True`` (raised on every rank).

    Also a ``FloatingPointError``.

    Examples
    --------
    >>> import numpy as np, ccl
    >>> ccl.compressed_allreduce(np.array([1.0, np.nan], np.float32), "fp16",
    ...                          algorithm="ring", check_finite=True)
    Traceback (most recent call last):
    ...
    ccl.errors.NonFiniteError: NaN or Inf in the input of rank(s) [...] to allreduce ...
    """


class CompressionOverflowError(CCLError, ArithmeticError):
    """A compressed sum exceeded what its format can hold (e.g. fp16 > 65504).

    Raised on every rank instead of returning a silently saturated result.

    Examples
    --------
    >>> import numpy as np, ccl
    >>> ccl.compressed_allreduce(np.full(4, 1e6, np.float32), "fp16", algorithm="ring")
    Traceback (most recent call last):
    ...
    ccl.errors.CompressionOverflowError: codec 'fp16': the sum overflowed ...
    """


class PeerError(CCLError, RuntimeError):
    """Another rank failed in the middle of a collective; the call has no result.

    The failing rank raises its own exception (``ranks`` lists it); every
    other rank raises this, after the collective has run to its end, so no
    rank waits for messages that never come.

    Parameters
    ----------
    message : str
        Which ranks failed, in which collective, with which exception class.
    ranks : list of int, optional
        The ranks that failed.

    Examples
    --------
    >>> from ccl import PeerError
    >>> err = PeerError("rank(s) [2] failed in allreduce (MemoryError)", ranks=[2])
    >>> err.ranks
    [2]
    """

    def __init__(self, message: str, ranks: list[int] | None = None) -> None:
        super().__init__(message)
        self.ranks = ranks


class LaunchError(CCLError, RuntimeError):
    """The launcher started N > 1 processes but MPI sees a 1-rank world (see ``ccl.launch``).

    ``expected`` is what the launcher said, ``world_size`` what MPI sees, and
    ``variable`` the environment variable the expectation came from.

    Parameters
    ----------
    message : str
        What happened and the likely fix for the loaded MPI library.
    expected : int, optional
        Processes the launcher started.
    world_size : int, optional
        ``MPI.COMM_WORLD``'s size.
    variable : str, optional
        The launcher variable that said so (e.g. ``"SLURM_STEP_NUM_TASKS"``).

    Examples
    --------
    >>> from ccl import LaunchError
    >>> from ccl.launch import check_launch
    >>> try:
    ...     check_launch(1, {"SLURM_STEP_NUM_TASKS": "4"})   # srun -n 4 with the wrong --mpi
    ... except LaunchError as exc:
    ...     print(exc.expected, exc.world_size, exc.variable)
    4 1 SLURM_STEP_NUM_TASKS
    """

    def __init__(self, message: str, expected: int | None = None, world_size: int | None = None,
                 variable: str | None = None) -> None:
        super().__init__(message)
        self.expected = expected
        self.world_size = world_size
        self.variable = variable
