"""Matching collectives by name when ranks submit them in different orders (Horovod's way).

The collectives' thread runs each rank's calls in the order it submitted
them, and each call starts with an exchange of the ranks' fingerprints
(:func:`ccl.torch.joins.negotiate`). When the fingerprints show different
*names* (rank 0 submitted ``a`` then ``b``, rank 1 ``b`` then ``a``), no
data moves; every rank reaches that verdict from the same rows and enters
:func:`match`, which repeats one small exchange per round:

* each rank sends whether its caller is blocked (waiting in
  ``synchronize``, so it will submit nothing before something completes)
  and the names of the collectives of that process set it has queued, in
  its submission order;
* a name queued on every rank is chosen (the first of them in the set's
  first rank's order) and moved to the head of each rank's queue, and the
  ranks run it;
* with no common name, the ranks wait (a short, growing pause) for further
  submissions; once every rank is blocked for :data:`STUCK_ROUNDS` rounds
  in a row, no rank can ever submit the missing names, and each rank's
  first queued call fails with :class:`~ccl.torch.HorovodInternalError`
  naming what it waited for, instead of hanging as Horovod would.

Names are compared by a 64-bit hash of the string; generated names
(``allreduce.noname.3``) take part too.

>>> import torch, ccl.torch as hvd
>>> hvd.init()
>>> order = ["a", "b"] if hvd.rank() % 2 == 0 else ["b", "a"]
>>> handles = {n: hvd.allreduce_async(torch.ones(2), name=n, op=hvd.Sum) for n in order}
>>> [hvd.synchronize(handles[n]).tolist() == [float(hvd.size())] * 2 for n in "ab"]
[True, True]
"""

import hashlib
import time

import numpy as np
from mpi4py import MPI

from .tensor_ops import HorovodInternalError

__all__ = ["match", "MAX_NAMES", "STUCK_ROUNDS"]

#: queued names a rank offers per round (later ones are offered once these ran)
MAX_NAMES = 64
#: rounds in a row with every rank blocked and no common name before the calls fail
STUCK_ROUNDS = 3
_FIRST_PAUSE, _LONGEST_PAUSE = 0.001, 0.05


def name_hash(name):
    """A collective's name as a signed 64-bit integer (the same on every rank)."""
    digest = hashlib.blake2b(str(name).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _queued(backlog, process_set):
    """The named collectives of ``process_set`` in ``backlog``, in submission order."""
    return [job for job in backlog if getattr(job, "process_set", None) is process_set
            and getattr(job, "label", None) is not None][:MAX_NAMES]


def match(blocked, process_set, backlog, pull):
    """Agree with the set's ranks on the next named collective; put it first (collective).

    Parameters
    ----------
    blocked : callable
        ``blocked()``: whether this rank's caller waits for a collective (it
        submits nothing more until one completes).
    process_set : ProcessSet
        The set whose ranks disagreed on the name of the first queued call.
    backlog : collections.deque
        This rank's queued collectives (jobs with ``process_set`` and
        ``label``), the first one the call the names differed on; reordered
        in place.
    pull : callable
        Moves newly submitted jobs into ``backlog``.
    """
    comm = process_set._comm
    pause, stuck = _FIRST_PAUSE, 0
    while True:
        # blocked is read before the pull: whatever the caller submitted before it
        # blocked is in the backlog the ranks compare
        waiting = bool(blocked())
        pull()
        queued = _queued(backlog, process_set)
        hashes = [name_hash(job.label[1]) for job in queued]
        row = np.zeros(2 + MAX_NAMES, dtype=np.int64)
        row[0], row[1] = waiting, len(hashes)
        row[2:2 + len(hashes)] = hashes
        rows = np.empty((comm.Get_size(), row.size), dtype=np.int64)
        comm.Allgather([row, MPI.INT64_T], [rows, MPI.INT64_T])
        offered = [rows[r, 2:2 + int(rows[r, 1])].tolist() for r in range(len(rows))]
        common = set.intersection(*map(set, offered))
        if common:
            chosen = next(h for h in offered[0] if h in common)
            job = queued[hashes.index(chosen)]
            backlog.remove(job)
            backlog.appendleft(job)
            return
        stuck = stuck + 1 if rows[:, 0].all() else 0
        if stuck >= STUCK_ROUNDS:
            head = backlog.popleft()
            names = [job.label[1] for job in queued]
            head.fail(HorovodInternalError(
                f"{head.label[0]}: the ranks wait for collectives of different names, none of "
                f"them submitted on every rank of the set (rank {comm.Get_rank()} of the set "
                f"queued {names!r:.300}): every rank must submit the same names"))
            return
        time.sleep(pause)
        pause = min(2 * pause, _LONGEST_PAUSE)
