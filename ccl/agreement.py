"""The agreement check: every rank learns whether all ranks passed the same arguments.

Before any data moves, a collective (and every collective set-up in
``ccl.torch``) exchanges one small fixed-size row per rank in a single
``Allgather``: an error code (did this rank reject its own arguments?), a
CRC of each field that must be equal everywhere, and flags that any rank may
raise. Then every rank reaches the same verdict from the same rows:

* a rank that rejected its arguments raises its own ``TypeError`` or
  ``ValueError``; every other rank raises :class:`ccl.MismatchError` naming it;
* if ranks passed different values of a field, every rank raises
  :class:`ccl.MismatchError` naming the field and the groups of ranks;
* otherwise each flag comes back as the list of ranks that raised it.

So an error on some ranks becomes an error on all of them, instead of some
ranks raising while the others wait forever in the exchange that follows.

>>> from mpi4py import MPI
>>> from ccl.agreement import agree
>>> agree(MPI.COMM_SELF, "example", [("shape", (3, 4))], flags=[("nan", False)])
{'nan': []}
"""

import zlib

import numpy as np
from mpi4py import MPI

from .errors import MismatchError, PeerError

__all__ = ["agree", "agreement_row", "verdict", "report_failure", "field_crc", "Fingerprinted"]

# error code of a rank whose own arguments were rejected (0: accepted)
_CODES = {TypeError: 1, ValueError: 2, MemoryError: 4, RuntimeError: 5}
_NAMES = {1: "TypeError", 2: "ValueError", 3: "error", 4: "MemoryError", 5: "RuntimeError"}


class Fingerprinted:
    """A field value whose fingerprint is known already (e.g. a codec's cached config hash).

    Parameters
    ----------
    value : object
        What error messages show.
    crc : int
        What the ranks compare.
    """

    __slots__ = ("value", "crc")

    def __init__(self, value, crc):
        self.value, self.crc = value, int(crc)

    def __repr__(self):
        return repr(self.value)


def field_crc(value):
    """The 32-bit fingerprint of a field value: the CRC of its ``repr`` (or its own crc)."""
    if isinstance(value, Fingerprinted):
        return value.crc
    return zlib.crc32(repr(value).encode("utf-8"))


def _code(error):
    if error is None:
        return 0
    return next((code for cls, code in _CODES.items() if isinstance(error, cls)), 3)


def agree(comm, what, fields, error=None, flags=(), wait=None):
    """Check that every rank of ``comm`` passed the same ``fields`` to ``what`` (collective).

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        The communicator the ranks share (ccl passes its private duplicate).
    what : str
        What is being agreed on, for messages (e.g. ``"allreduce"``).
    fields : sequence of (str, object)
        Named values that must be equal on every rank, compared by the CRC of
        their ``repr``; the first field that differs is reported.
    error : Exception, optional
        This rank's own argument error: it is raised here, after the
        exchange, so the other ranks learn about it.
    flags : sequence of (str, bool)
        Conditions any rank may report (e.g. "my input holds NaN").
    wait : callable, optional
        ``wait(request, description)`` completes the nonblocking exchange
        (ccl's channels wait with a deadline); default ``request.Wait()``.

    Returns
    -------
    dict
        Flag name -> the ranks (sorted) that raised it.

    Raises
    ------
    TypeError, ValueError
        ``error``, on the rank that passed it.
    ccl.MismatchError
        On every other rank when some rank rejected its arguments, and on
        every rank when a field differs.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> agree(MPI.COMM_WORLD, "example", [("dtype", "float32")])
    {}
    """
    fields, flags = list(fields), list(flags)
    row = agreement_row(fields, error, flags)
    rows = _exchange(comm, row, wait, f"the argument check of {what} from every rank")
    return verdict(comm, what, fields, row, rows, error, flags)


def agreement_row(fields, error=None, flags=()):
    """This rank's row of :func:`agree`: error code, field CRCs, flags (int64)."""
    return np.array([_code(error)] + [field_crc(value) for _, value in fields]
                    + [bool(flag) for _, flag in flags], dtype=np.int64)


def verdict(comm, what, fields, row, rows, error=None, flags=(), ranks=None):
    """The decision of :func:`agree` from the exchanged ``rows`` (the same on every rank).

    ``ranks`` names the rank of each row where the rows are not all of
    ``comm``'s ranks (default: row ``i`` is rank ``i``). Raises as :func:`agree`.
    """
    flags = list(flags)
    names = np.arange(len(rows)) if ranks is None else np.asarray(ranks)
    if error is not None:
        raise error
    if rows.tobytes() == row.tobytes() * len(rows):
        # every rank sent this rank's row, which holds no error: the common case, decided
        # by one comparison of bytes; each flag is raised everywhere or nowhere
        return {name: names.tolist() if flag else [] for name, flag in flags}
    first = 1 + len(fields)
    same = (rows[:, :first] == rows[0, :first]).all(axis=0)
    if not same[0] or rows[0, 0]:
        rows_rejected = np.flatnonzero(rows[:, 0])
        rejected = [int(names[r]) for r in rows_rejected]
        kinds = sorted({_NAMES[int(rows[r, 0])] for r in rows_rejected})
        raise MismatchError(f"rank(s) {rejected} rejected their arguments to {what} "
                            f"({', '.join(kinds)}); see the error raised there",
                            field="arguments", ranks={"rejected": rejected})
    if not same.all():  # the first field that differs is reported
        column = int(np.flatnonzero(~same)[0])
        name, value = fields[column - 1]
        groups = {}
        for rank, crc in zip(names.tolist(), rows[:, column].tolist()):
            groups.setdefault(crc, []).append(rank)
        where = "; ".join(f"ranks {ranks}" for ranks in groups.values())
        raise MismatchError(
            f"ranks disagree on the {name} of {what}: {where} differ (this rank, "
            f"{comm.Get_rank()}, has {value!r:.300})", field=name,
            ranks=list(groups.values()))
    raised = rows[:, first:].any(axis=0)
    return {name: [int(names[r]) for r in np.flatnonzero(rows[:, first + i])] if raised[i]
            else [] for i, (name, _) in enumerate(flags)}


def report_failure(comm, what, error, wait=None):
    """After a collective in which a rank failed, raise on every rank (collective).

    Every rank must call it (they all saw the failure's flag in the result):
    the ranks whose ``error`` is set raise it, the others raise
    :class:`ccl.PeerError` naming them.

    Raises
    ------
    Exception
        ``error``, on the ranks where it is set.
    ccl.PeerError
        On the other ranks.
    """
    row = np.array([_code(error)], dtype=np.int64)
    rows = _exchange(comm, row, wait, f"the failure report of {what} from every rank")
    if error is not None:
        raise error
    failed = [int(r) for r in np.flatnonzero(rows[:, 0])]
    kinds = sorted({_NAMES[int(rows[r, 0])] for r in failed})
    raise PeerError(f"rank(s) {failed} failed in the middle of {what} ({', '.join(kinds)}); "
                    "the call has no result: see the error raised there", ranks=failed)


def _exchange(comm, row, wait, description):
    rows = np.empty((comm.Get_size(), row.size), dtype=np.int64)
    request = comm.Iallgather([row, MPI.INT64_T], [rows, MPI.INT64_T])
    if wait is None:
        request.Wait()
    else:
        wait(request, description)
    return rows
