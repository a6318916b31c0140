"""The channel: ccl's private duplicate of a user communicator, and point-to-point payloads.

Library traffic runs on a duplicate of the user's communicator, cached on it
as an attribute (freed with it), so ccl's messages can never match the user's.
Payloads are 1-D ``uint8`` arrays sent as ``[buf, MPI.BYTE]``: nothing on the
data path is pickled, and only mpi4py's upper-case (buffer) methods are used.

Receives do not need to know a payload's size in advance: a matched probe
(``Improbe``) reports it, so variable-length payloads (sparse codecs, zero-run
encoding) need no extra round trip. Every wait polls with a deadline
(``timeout`` argument or ``CCL_TIMEOUT`` seconds) and yields the core between
tests (:mod:`ccl.transport.waits`). Creating the channel (the duplicate) is
collective: the ranks first agree that their ``CCL_*`` variables parse, and
both steps wait with ``CCL_TIMEOUT``'s deadline.

A :class:`Channel` does three jobs, each written in its own module: the
point-to-point payloads (here), the MPI library's own collectives
(:mod:`ccl.transport.mpi_calls`) and the waits
(:mod:`ccl.transport.waits`). Device (cupy) payloads take the channel's
route (:mod:`ccl.transport.staging`): straight to a CUDA-aware MPI after a
stream synchronisation, otherwise through pinned host buffers reused across
calls. What ``auto`` and the thread budget measured about the ranks is kept
in the channel's :class:`~ccl.transport.cache.Measurements`.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, cast

import numpy as np
from mpi4py import MPI

from .. import config, launch, trace
from .._xp import Backend
from ..agreement import agree
from .cache import Measurements, comm_cache
from .mpi_calls import MPICalls
from .staging import Route
from .waits import Waiting, stall_period, wait_for

__all__ = ["Channel", "Topology", "channel", "private_duplicate"]

_BYTE = MPI.BYTE


class Channel(Waiting, MPICalls):
    """The private duplicate of a user communicator, with ccl's per-communicator state.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        The user's communicator.
    duplicate : bool
        Run on a private duplicate of ``comm`` (collective: :func:`private_duplicate`);
        False runs on ``comm`` itself (the node and cross-node communicators
        of a :class:`Topology`, which are ccl's own already).
    scope : str, optional
        What the ranks are, for the reports' rank names (e.g. "its node").

    Attributes
    ----------
    comm : mpi4py.MPI.Intracomm
        The private duplicate all library traffic runs on.
    rank, size : int
        This rank and the number of ranks of ``comm``.
    calls : int
        Collectives started on it (the step of keyless calls; agrees on every
        rank because every rank calls collectives in the same order).
    bytes_sent : int
        Payload bytes this rank put on the wire (see each method).
    plain_bytes_sent : int
        The part of ``bytes_sent`` sent uncompressed: by the MPI library's
        own collectives, and every byte of a call whose codec is an
        identity (``ccl.collectives.plan.run`` counts those).
    activity : str
        What runs on the channel, for timeout and stall reports ("idle"
        between collectives; a collective may make it more precise).
    timeout : float or None
        Seconds a wait of the current collective may last (None or
        ``math.inf``: forever).
    route : ccl.transport.staging.Route
        Where the current collective's payloads meet MPI (host or device).
    measured : ccl.transport.cache.Measurements
        What was measured about the ranks, once: the link, the latency, the
        share of cores, the codec speeds, the thread budget.

    Notes
    -----
    One collective runs on a channel at a time: :meth:`collective` takes the
    channel's lock for the body of its ``with`` block, so collectives of two
    threads on one communicator never interleave their messages. (Their
    *order* may still differ between ranks; the agreement names the calling
    thread, so such a pairing raises instead of mixing data: see
    docs/reliability.md.)
    """

    def __init__(self, comm: MPI.Intracomm, duplicate: bool = True,
                 scope: str | None = None) -> None:
        self.comm = private_duplicate(comm) if duplicate else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.calls = 0
        self.bytes_sent = self.plain_bytes_sent = 0
        self.route = Route()
        self.measured = Measurements()
        self._lock = threading.Lock()
        # (request, buffer) of this call's sends, and of earlier calls that ended by an
        # exception with sends still in flight: MPI may still read those buffers
        self._sends: list[tuple[MPI.Request, object]] = []
        self._tag_ub = max(int(self.comm.Get_attr(MPI.TAG_UB) or 32767), 32767)
        self._tag = 0
        self.activity = "idle"
        self.timeout: float | None = None
        self._topology: Topology | None = None
        self.init_waiting(scope)  # reports name world ranks; the stall inspector

    def free(self) -> None:
        """Free the private communicator, and the node's (idempotent)."""
        if self._topology is not None:
            self._topology.free()
            self._topology = None
        if self.comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self.comm.Free()

    def topology(self) -> Topology:
        """The :class:`Topology` of this channel's ranks: nodes, and ranks across nodes.

        Collective the first time (it splits the communicator); every rank
        then has it. Nodes come from :func:`ccl.launch.node_comm` (shared
        memory, or ``CCL_LOCAL_SIZE``).
        """
        if self._topology is None:
            self._topology = Topology(self)
        return self._topology

    # ----------------------------------------------------------------- calls
    @contextlib.contextmanager
    def collective(self, activity: str, timeout: float | None) -> Iterator[int]:
        """Run one collective on the channel: ``with channel.collective(...) as tag:``.

        Takes the channel for the body of the block (one collective at a
        time) and gives it a fresh tag for its messages; releases it when the
        block ends. Where the block raised, sends still in flight keep their
        buffers alive (and staging buffers are not reused) until MPI is done
        with them, instead of letting MPI read freed memory.

        Parameters
        ----------
        activity : str
            What the collective is, for timeout and stall reports.
        timeout : float or None
            Seconds each wait may last (None or ``math.inf``: forever).

        Yields
        ------
        int
            The tag of this collective's messages.

        Raises
        ------
        RuntimeError
            After ``MPI.Finalize()`` (no MPI call is made then).
        ValueError
            Once the user's communicator (and with it this channel) was freed.
        """
        tag = self._begin(activity, timeout)
        completed = False
        try:
            yield tag
            completed = True
        finally:
            self._end(completed)

    def _begin(self, activity, timeout):
        _check_usable(self.comm)
        self._lock.acquire()
        if self._sends:  # sends an earlier, failed call left in flight
            self._sends = [(r, buf) for r, buf in self._sends if not r.Test()]
        self.calls += 1
        self._tag = (self._tag + 1) % self._tag_ub
        self.activity = activity
        self.timeout = timeout
        self.stall = stall_period()
        self.forget_stalls()
        return self._tag

    def _end(self, completed):
        self.activity = "idle"
        try:
            if completed:
                self._sends.clear()
            else:
                self._sends = [(r, buf) for r, buf in self._sends if not r.Test()]
            self.route.end(reuse=not self._sends)
        finally:
            self._lock.release()

    def describe(self, activity: str) -> None:
        """Say more precisely what the current collective does (the wait reports name it)."""
        self.activity = activity

    def resume_calls(self, calls: int) -> None:
        """Continue the count of collectives from a checkpoint's (the step of keyless calls).

        Every rank must resume the same count, as every rank counted alike.
        """
        self.calls = int(calls)

    # ---------------------------------------------------------- traffic counters
    def traffic(self) -> tuple[int, int]:
        """``(bytes_sent, plain_bytes_sent)`` so far: subtract two to count one call."""
        return self.bytes_sent, self.plain_bytes_sent

    def count_as_plain(self, since: tuple[int, int]) -> None:
        """Count every byte sent after ``since`` (a :meth:`traffic`) as uncompressed.

        For a call whose codec is an identity: its payloads are the values
        themselves.
        """
        sent, plain = since
        self.plain_bytes_sent = plain + self.bytes_sent - sent

    def add_traffic(self, sent: int, plain: int) -> None:
        """Count bytes other channels sent for this channel's collective.

        The hierarchical algorithm sends on the node's and the cross-node
        channels; the call's traffic is theirs.
        """
        self.bytes_sent += sent
        self.plain_bytes_sent += plain

    def use_backend(self, backend: Backend, aware: bool | None = None) -> None:
        """Route the current collective's payloads for ``backend``'s arrays (host or device).

        Holds until the collective ends (:meth:`collective`). ``aware``
        overrides the CUDA-aware detection
        (:func:`ccl.transport.staging.cuda_aware`).
        """
        self.route.use(backend, aware)

    @property
    def backend(self) -> Backend | None:
        """The backend of the latest collective's arrays (None before the first)."""
        return self.route.backend

    # ---------------------------------------------------------- point to point
    def isend(self, payload: np.ndarray, dest: int, tag: int) -> MPI.Request:
        """Start sending ``payload`` to ``dest``; return the request."""
        self.bytes_sent += payload.size
        wire = self.route.send_buffer(payload)
        request = self.comm.Isend([wire, _BYTE], dest, tag)
        self._sends.append((request, wire))
        return request

    def recv(self, source: int, tag: int) -> np.ndarray:
        """Receive a payload of any length from ``source``."""
        with self._reporting(f"a message from {self.who(source)}"), \
                trace.span("WIRE", "recv", source=source) as args:
            payload = self._recv(source, tag)
            if args is not None:
                args["bytes"] = int(payload.nbytes)
            return payload

    def _recv(self, source, tag):
        status = MPI.Status()
        message = self._poll(lambda: self.comm.Improbe(source, tag, status),
                             f"a message from {self.who(source)}")
        buf = self.route.recv_buffer(status.Get_count(_BYTE))
        message.Recv([buf, _BYTE])
        return self.route.finish(buf)

    def sendrecv(self, payload: np.ndarray, dest: int, source: int, tag: int) -> np.ndarray:
        """Send to ``dest`` while receiving from ``source``; return what arrived."""
        request = self.isend(payload, dest, tag)
        received = self.recv(source, tag)
        self.wait(request, f"the send to {self.who(dest)}")
        return received


class Topology:
    """The nodes of a channel's ranks, as two more channels (see :meth:`Channel.topology`).

    Attributes
    ----------
    local : Channel
        The ranks of this rank's node (their own communicator).
    cross : Channel
        The ranks with this rank's local rank, one per node.
    node_sizes : list of int
        Ranks per node, in the order of the nodes' first ranks (agreed).
    """

    def __init__(self, channel: Channel) -> None:
        # the agreement inside node_comm waits with the channel's deadline: every rank has
        # reached this point before the splits (which MPI offers only as blocking calls)
        local = launch.node_comm(channel.comm, wait=channel.wait)
        # an intracommunicator's split is one (mpi4py's types say Comm)
        cross = cast(MPI.Intracomm, channel.comm.Split(local.Get_rank(), key=channel.rank))
        self.local = Channel(local, duplicate=False, scope="its node")
        self.cross = Channel(cross, duplicate=False, scope="the ranks across nodes")
        # every rank learns every node's size: (first rank of my node, my node's size)
        mine = np.array([channel.rank if local.Get_rank() == 0 else -1, local.Get_size()],
                        dtype=np.int64)
        rows = np.empty((channel.size, 2), dtype=np.int64)
        channel.wait(channel.comm.Iallgather([mine, MPI.INT64_T], [rows, MPI.INT64_T]),
                     "the node sizes of every rank")
        self.node_sizes = [int(size) for first, size in rows if first >= 0]

    @property
    def uniform(self) -> bool:
        """Whether every node holds the same number of ranks."""
        return len(set(self.node_sizes)) == 1

    def free(self) -> None:
        """Free the node and cross-node communicators."""
        self.local.free()
        self.cross.free()


def _check_usable(comm):
    if MPI.Is_finalized():
        raise RuntimeError("MPI is finalized: ccl's collectives cannot run after "
                           "MPI.Finalize() (mpi4py calls it at exit)")
    if isinstance(comm, MPI.Comm) and comm == MPI.COMM_NULL:
        raise ValueError("the communicator was freed (or is MPI.COMM_NULL): create the "
                         "Communicator on a communicator that is still in use")


def channel(comm: MPI.Intracomm) -> Channel:
    """Return the :class:`Channel` cached on ``comm``, creating it (collectively) if needed.

    The first call in a process also runs :func:`ccl.launch.check_launch`:
    if the launcher started several processes but each sees a 1-rank world,
    every communicator is a singleton, so it raises here, before a collective
    can silently return its local input.

    Raises
    ------
    TypeError
        If ``comm`` is not an mpi4py intracommunicator.
    ccl.LaunchError
        On the silent-singleton trap (see :mod:`ccl.launch`).
    """
    _check_usable(comm)
    if not isinstance(comm, MPI.Intracomm):
        raise TypeError(f"comm must be an mpi4py intracommunicator (e.g. MPI.COMM_WORLD), "
                        f"got {type(comm).__name__}")
    cache = comm_cache(comm)
    ch = cache.get("channel")  # made once, never replaced: no lock needed to read it
    if ch is None:
        # Creating the channel duplicates ``comm`` (a collective): two threads doing it at
        # once would run two Dups concurrently on one communicator, which MPI forbids.
        with cache.lock:
            ch = cache.get("channel")
            if ch is None:
                ch = cache["channel"] = Channel(comm)
    # after the channel's creation, whose agreement has checked every CCL_* variable
    # (CCL_SKIP_LAUNCH_CHECK among them) on every rank
    launch.check_launch_once()
    return ch


def private_duplicate(comm: MPI.Intracomm) -> MPI.Intracomm:
    """A private duplicate of ``comm`` (collective), after every rank checked its variables.

    Every ``CCL_*`` variable is parsed first and the ranks agree on the
    outcome, so a bad value on one rank raises on every rank (before, the
    others would wait in the duplication forever). Both waits honour
    ``CCL_TIMEOUT``.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        The user's communicator.

    Returns
    -------
    mpi4py.MPI.Intracomm
        Its duplicate (the caller frees it).
    """
    error = config.check_environment()
    try:
        timeout = config.read("CCL_TIMEOUT")
    except ValueError:
        timeout = None  # the agreement reports it
    activity = "the creation of ccl's private communicator"

    def wait(request, what):
        wait_for(comm, request, what, activity, timeout)

    agree(comm, activity, [], error, wait=wait)
    new, request = comm.Idup()
    wait(request, "every rank to duplicate the communicator (MPI_Comm_idup)")
    return new
