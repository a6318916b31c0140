"""The MPI library's own collectives on a channel: of byte payloads, and of plain values.

:class:`MPICalls` is the part of :class:`ccl.transport.p2p.Channel` that calls
the MPI library's collectives instead of sending point to point:

* on **byte payloads** of any length (``allgather``, ``bcast``): what the
  ``allgather`` and ``tree`` algorithms send their compressed chunks with;
* on **plain values**, uncompressed: ``allreduce_sum`` (the ``mpi``
  algorithm), ``reduce_scatter_sum`` and ``allgather_blocks`` (the exact
  steps of ``hierarchical`` inside a node), and ``allreduce_max`` (the
  statistics codecs share).

Every call is nonblocking and completed by the channel's :meth:`wait
<ccl.transport.waits.Waiting.wait>`, so it honours the deadline and the
stall inspector like every other wait. Each counts the bytes a ring (or a
binomial tree, for ``bcast``) would put on the wire from this rank: the MPI
library does not say what it sent.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from mpi4py import MPI

from .staging import Route

__all__ = ["MPICalls"]

_BYTE = MPI.BYTE


class MPICalls:
    """The MPI library's collectives, for :class:`ccl.transport.p2p.Channel` to inherit.

    The channel provides ``comm``, ``rank``, ``size``, ``wait(request,
    what)``, ``who(rank)``, ``route`` (a :class:`ccl.transport.staging.Route`)
    and the counters ``bytes_sent`` and ``plain_bytes_sent``.
    """

    # what the channel provides (declared for readers and type checkers)
    comm: MPI.Intracomm
    rank: int
    size: int
    route: Route
    bytes_sent: int
    plain_bytes_sent: int
    wait: Callable[[MPI.Request, str], None]
    who: Callable[[int], str]

    # --------------------------------------------------------- byte payloads
    def allgather(self, payload: np.ndarray) -> list:
        """Gather every rank's payload (lengths may differ); return them in rank order."""
        sizes = np.empty(self.size, dtype=np.int64)
        mine = np.array([payload.size], dtype=np.int64)
        self.wait(self.comm.Iallgather([mine, MPI.INT64_T], [sizes, MPI.INT64_T]),
                  "payload sizes from every rank")
        displs = np.zeros(self.size, dtype=np.int64)
        np.cumsum(sizes[:-1], out=displs[1:])
        recvbuf = self.route.recv_buffer(int(sizes.sum()))
        # a ring allgather forwards every block but the right neighbour's own
        self.bytes_sent += int(sizes.sum() - sizes[(self.rank + 1) % self.size])
        self.wait(self.comm.Iallgatherv([self.route.send_buffer(payload), _BYTE],
                                        [recvbuf, (sizes, displs), _BYTE]),
                  "payloads from every rank")
        recvbuf = self.route.finish(recvbuf)
        return [recvbuf[displs[i]:displs[i] + sizes[i]] for i in range(self.size)]

    def bcast(self, payload: np.ndarray, root: int) -> np.ndarray:
        """Broadcast a payload of any length from ``root``; return it on every rank."""
        size = np.array([payload.size if self.rank == root else 0], dtype=np.int64)
        self.wait(self.comm.Ibcast([size, MPI.INT64_T], root), f"the size from {self.who(root)}")
        buf = (self.route.send_buffer(payload) if self.rank == root
               else self.route.recv_buffer(int(size[0])))
        # binomial broadcast: a rank sends one copy to each of its children
        relative = (self.rank - root) % self.size
        mask = 1
        while mask < self.size and not relative & mask:
            if relative + mask < self.size:
                self.bytes_sent += int(size[0])
            mask <<= 1
        self.wait(self.comm.Ibcast([buf, _BYTE], root), f"the payload from {self.who(root)}")
        return payload if self.rank == root else self.route.finish(buf)

    # ---------------------------------------------------------- plain values
    def allreduce_max(self, values) -> np.ndarray:
        """Element-wise MAX of a small float64 array over all ranks (on the host)."""
        values = np.ascontiguousarray(values, dtype=np.float64)
        out = np.empty_like(values)
        self.wait(self.comm.Iallreduce([values, MPI.DOUBLE], [out, MPI.DOUBLE], op=MPI.MAX),
                  "the shared codec parameters")
        return out

    def allreduce_sum(self, x):
        """The MPI library's own ``Allreduce(SUM)`` of a float32/float64 array."""
        # counted as a ring allreduce: 2 (p-1)/p of the array
        self._sent_plain(2 * (self.size - 1) * x.nbytes // self.size)

        def run(a, xp):
            out = xp.empty_like(a)
            self.wait(self.comm.Iallreduce(a, out, op=MPI.SUM), "MPI_Allreduce")
            return out
        return self.route.uncompressed(x, run)

    def reduce_scatter_sum(self, x, bounds):
        """The MPI library's own ``Reduce_scatter(SUM)``: this rank's block of ``bounds``.

        Rank ``r``'s block is ``x[bounds[r]:bounds[r+1]]``.
        """
        counts = [int(c) for c in np.diff(bounds)]
        self._sent_plain((self.size - 1) * x.nbytes // self.size)  # as a ring

        def run(a, xp):
            out = xp.empty(counts[self.rank], dtype=a.dtype)
            self.wait(self.comm.Ireduce_scatter(a, out, counts, op=MPI.SUM),
                      "MPI_Reduce_scatter")
            return out
        return self.route.uncompressed(x, run)

    def allgather_blocks(self, block, bounds):
        """The MPI library's own ``Allgatherv`` of every rank's block (``bounds`` as above)."""
        counts = [int(c) for c in np.diff(bounds)]
        self._sent_plain((int(bounds[-1]) - block.size) * block.itemsize)  # as a ring

        def run(a, xp):
            out = xp.empty(int(bounds[-1]), dtype=a.dtype)
            self.wait(self.comm.Iallgatherv(a, [out, (counts, [int(b) for b in bounds[:-1]])]),
                      "MPI_Allgatherv")
            return out
        return self.route.uncompressed(block, run)

    def _sent_plain(self, nbytes: int) -> None:
        self.bytes_sent += nbytes
        self.plain_bytes_sent += nbytes
