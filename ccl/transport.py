"""Moving byte payloads between ranks on a private communicator.

Library traffic runs on a duplicate of the user's communicator, cached on it
as an attribute (freed with it), so ccl's messages can never match the user's.
Payloads are 1-D ``uint8`` arrays sent as ``[buf, MPI.BYTE]``: nothing on the
data path is pickled, and only mpi4py's upper-case (buffer) methods are used.

Receives do not need to know a payload's size in advance: a matched probe
(``Improbe``) reports it, so variable-length payloads (sparse codecs, zero-run
encoding) need no extra round trip. Every wait polls with a deadline
(``timeout`` argument or ``CCL_TIMEOUT`` seconds); when it passes, the rank
reports which collective and key it was waiting on and aborts the job, so a
dead or diverged peer never hangs the job forever; a wait that lasts warns
which ranks are missing (:mod:`ccl.waits`, which holds the waiting). Between
tests a waiting rank yields its core (see ``POLL_SPIN_S``). Creating the
channel (the duplicate) is collective: the ranks first agree that their
``CCL_*`` variables parse, and both steps wait with ``CCL_TIMEOUT``'s deadline.

Device (cupy) payloads go through :class:`ccl._staging.Stager`: straight to
a CUDA-aware MPI after a stream synchronisation, otherwise staged through
pinned host buffers that are reused across calls.
"""

import threading

import numpy as np
from mpi4py import MPI

from . import config, trace
from ._staging import Stager, cuda_aware
from .agreement import agree
from .launch import check_launch, node_comm
from .waits import POLL_SLEEP_MAX_S, POLL_SPIN_S, Waiting, stall_period, wait_for

__all__ = ["Channel", "channel", "comm_cache", "private_duplicate", "POLL_SPIN_S", "POLL_SLEEP_MAX_S"]

_BYTE = MPI.BYTE
_KEYVAL = None
_LAUNCH_CHECKED = False  # ccl.launch.check_launch passed once in this process
# Guards the creation of the per-communicator caches (no MPI calls under it).
_CACHE_LOCK = threading.Lock()


class Channel(Waiting):
    """The private duplicate of a user communicator, with ccl's per-communicator state.

    Attributes
    ----------
    comm : mpi4py.MPI.Intracomm
        The private duplicate all library traffic runs on.
    calls : int
        Collectives started on it (the step of keyless calls; agrees on every
        rank because every rank calls collectives in the same order).
    bytes_sent : int
        Payload bytes this rank put on the wire (see each method).
    plain_bytes_sent : int
        The part of ``bytes_sent`` sent uncompressed: by the MPI library's
        own collectives, and every byte of a call whose codec is an
        identity (``ccl.collectives.plan.run`` counts those).
    probed_link_gbps : float or None
        The link speed measured for ``auto`` (None until it is measured).
    probed_latency : float or None
        Seconds per step of point-to-point messages, measured for ``auto``
        (None until it is measured).
    cores_share, link_profiles, link_profile, codec_speeds, codec_names
        What ``auto`` decides from, found once (``ccl.collectives.link``): the
        share of cores, the profile per link speed given, the latest used,
        codec speeds measured (and their codec ids) by config hash.
    thread_budget : tuple or None
        ``(numba threads of this rank, smallest share of cores of any rank)``
        (:func:`ccl.threads.channel_budget`; None until the first call).

    One collective runs on a channel at a time: :meth:`begin` takes the
    channel's lock and :meth:`end` releases it, so collectives of two threads
    on one communicator never interleave their messages. (Their *order* may
    still differ between ranks; the agreement names the calling thread, so
    such a pairing raises instead of mixing data: see docs/reliability.md.)
    """

    def __init__(self, comm, duplicate=True, scope=None):
        self.comm = private_duplicate(comm) if duplicate else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.calls = 0
        self.bytes_sent = self.plain_bytes_sent = 0
        self.probed_link_gbps = self.probed_spread = None  # measured once, when auto needs it
        self.probed_latency = None  # seconds per step of messages, likewise
        self.cores_share = None  # auto's share of cores, likewise
        self.link_profiles = {}  # auto's inputs, per link speed given
        self.link_profile = None  # the latest of them (Communicator.stats()["auto"])
        self.codec_speeds, self.codec_names = {}, {}  # measured, by codec config hash
        self.thread_budget = None  # (threads, agreed share of cores), at the first call
        self._lock = threading.Lock()
        # (request, buffer) of this call's sends, and of earlier calls that ended by an
        # exception with sends still in flight: MPI may still read those buffers
        self._sends = []
        self._tag_ub = max(int(self.comm.Get_attr(MPI.TAG_UB) or 32767), 32767)
        self._tag = 0
        # what the current collective is, for timeout reports
        self.activity = "idle"
        self.timeout = None
        # device payloads of the current collective go through a stager (None: host)
        self._stager = None
        self.backend = None  # of the current collective's arrays (set by use_backend)
        self._stagers = {}  # backend name -> Stager, so pinned buffers outlive a call
        self._topology = None
        self.init_waiting(scope)  # reports name world ranks; the stall inspector

    def free(self):
        """Free the private communicator, and the node's (idempotent)."""
        if self._topology is not None:
            self._topology.free()
            self._topology = None
        if self.comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self.comm.Free()

    def topology(self):
        """The :class:`Topology` of this channel's ranks: nodes, and ranks across nodes.

        Collective the first time (it splits the communicator); every rank
        then has it. Nodes come from :func:`ccl.launch.node_comm` (shared
        memory, or ``CCL_LOCAL_SIZE``).
        """
        if self._topology is None:
            self._topology = Topology(self)
        return self._topology

    # ----------------------------------------------------------------- calls
    def begin(self, activity, timeout):
        """Start a collective: take the channel and return the call's tag.

        ``timeout`` is in seconds (None or ``math.inf``: wait forever). Every
        :meth:`begin` must be followed by :meth:`end`.

        Raises
        ------
        RuntimeError
            After ``MPI.Finalize()`` (no MPI call is made then).
        ValueError
            Once the user's communicator (and with it this channel) was freed.
        """
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

    def end(self, completed=True):
        """Finish the current collective and free the channel.

        ``completed=False`` (the collective raised): sends still in flight keep
        their buffers alive (and staging buffers are not reused) until MPI is
        done with them, instead of letting MPI read freed memory.
        """
        self.activity = "idle"
        try:
            if completed:
                self._sends.clear()
            else:
                self._sends = [(r, buf) for r, buf in self._sends if not r.Test()]
            if self._stager is not None:
                self._stager.release_all(reuse=not self._sends)
        finally:
            self._stager = None
            self._lock.release()

    def use_backend(self, backend, aware=None):
        """Route this collective's payloads for ``backend``'s arrays (host or device).

        ``aware`` overrides the CUDA-aware detection (:func:`ccl._staging.cuda_aware`).
        """
        self.backend = backend
        if not backend.device:
            self._stager = None
            return
        aware = cuda_aware() if aware is None else aware
        key = (backend.name, aware)
        if key not in self._stagers:
            self._stagers[key] = Stager(backend, aware)
        self._stager = self._stagers[key]

    def _wire(self, payload):
        return payload if self._stager is None else self._stager.send_buffer(payload)

    def _landing(self, nbytes):
        if self._stager is None:
            return np.empty(nbytes, dtype=np.uint8)
        return self._stager.recv_buffer(nbytes)

    def _landed(self, buf):
        return buf if self._stager is None else self._stager.finish(buf)

    # ---------------------------------------------------------- point to point
    def isend(self, payload, dest, tag):
        """Start sending ``payload`` to ``dest``; return the request."""
        self.bytes_sent += payload.size
        wire = self._wire(payload)
        request = self.comm.Isend([wire, _BYTE], dest, tag)
        self._sends.append((request, wire))
        return request

    def recv(self, source, tag):
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
        buf = self._landing(status.Get_count(_BYTE))
        message.Recv([buf, _BYTE])
        return self._landed(buf)

    def sendrecv(self, payload, dest, source, tag):
        """Send to ``dest`` while receiving from ``source``; return what arrived."""
        request = self.isend(payload, dest, tag)
        received = self.recv(source, tag)
        self.wait(request, f"the send to {self.who(dest)}")
        return received

    # ------------------------------------------------------------ collectives
    def allgather(self, payload):
        """Gather every rank's payload (lengths may differ); return them in rank order."""
        sizes = np.empty(self.size, dtype=np.int64)
        mine = np.array([payload.size], dtype=np.int64)
        self.wait(self.comm.Iallgather([mine, MPI.INT64_T], [sizes, MPI.INT64_T]),
                  "payload sizes from every rank")
        displs = np.zeros(self.size, dtype=np.int64)
        np.cumsum(sizes[:-1], out=displs[1:])
        recvbuf = self._landing(int(sizes.sum()))
        # a ring allgather forwards every block but the right neighbour's own
        self.bytes_sent += int(sizes.sum() - sizes[(self.rank + 1) % self.size])
        self.wait(self.comm.Iallgatherv([self._wire(payload), _BYTE],
                                        [recvbuf, (sizes, displs), _BYTE]),
                  "payloads from every rank")
        recvbuf = self._landed(recvbuf)
        return [recvbuf[displs[i]:displs[i] + sizes[i]] for i in range(self.size)]

    def allreduce_max(self, values):
        """Element-wise MAX of a small float64 array over all ranks."""
        values = np.ascontiguousarray(values, dtype=np.float64)
        out = np.empty_like(values)
        self.wait(self.comm.Iallreduce([values, MPI.DOUBLE], [out, MPI.DOUBLE], op=MPI.MAX),
                  "the shared codec parameters")
        return out

    def bcast(self, payload, root):
        """Broadcast a payload of any length from ``root``; return it on every rank."""
        size = np.array([payload.size if self.rank == root else 0], dtype=np.int64)
        self.wait(self.comm.Ibcast([size, MPI.INT64_T], root), f"the size from {self.who(root)}")
        buf = self._wire(payload) if self.rank == root else self._landing(int(size[0]))
        # binomial broadcast: a rank sends one copy to each of its children
        relative = (self.rank - root) % self.size
        mask = 1
        while mask < self.size and not relative & mask:
            if relative + mask < self.size:
                self.bytes_sent += int(size[0])
            mask <<= 1
        self.wait(self.comm.Ibcast([buf, _BYTE], root), f"the payload from {self.who(root)}")
        return payload if self.rank == root else self._landed(buf)

    def _sent_plain(self, nbytes):
        self.bytes_sent += nbytes
        self.plain_bytes_sent += nbytes

    def allreduce_sum(self, x):
        """The MPI library's own ``Allreduce(SUM)`` of a float32/float64 array."""
        # counted as a ring allreduce: 2 (p-1)/p of the array
        self._sent_plain(2 * (self.size - 1) * x.nbytes // self.size)

        def run(a, xp):
            out = xp.empty_like(a)
            self.wait(self.comm.Iallreduce(a, out, op=MPI.SUM), "MPI_Allreduce")
            return out
        return self._uncompressed(x, run)

    def reduce_scatter_sum(self, x, bounds):
        """The MPI library's own ``Reduce_scatter(SUM)``: this rank's block ``bounds[r]:bounds[r+1]``."""
        counts = [int(b - a) for a, b in zip(bounds[:-1], bounds[1:])]
        self._sent_plain((self.size - 1) * x.nbytes // self.size)  # as a ring

        def run(a, xp):
            out = xp.empty(counts[self.rank], dtype=a.dtype)
            self.wait(self.comm.Ireduce_scatter(a, out, counts, op=MPI.SUM),
                      "MPI_Reduce_scatter")
            return out
        return self._uncompressed(x, run)

    def allgather_blocks(self, block, bounds):
        """The MPI library's own ``Allgatherv`` of every rank's block ``bounds[r]:bounds[r+1]``."""
        counts = [int(b - a) for a, b in zip(bounds[:-1], bounds[1:])]
        self._sent_plain((int(bounds[-1]) - block.size) * block.itemsize)  # as a ring

        def run(a, xp):
            out = xp.empty(int(bounds[-1]), dtype=a.dtype)
            self.wait(self.comm.Iallgatherv(a, [out, (counts, [int(b) for b in bounds[:-1]])]),
                      "MPI_Allgatherv")
            return out
        return self._uncompressed(block, run)

    def _uncompressed(self, x, run):
        """``run(array, xp)``: an MPI call on uncompressed data, where MPI can read it."""
        stager = self._stager
        if stager is None:
            return run(x, np)
        be = stager.backend
        if not stager.aware:  # uncompressed data: the whole array is staged
            return be.to_device(run(be.to_host(x), np))
        be.synchronize()
        return run(x, be.xp)


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

    def __init__(self, channel):
        # the agreement inside node_comm waits with the channel's deadline: every rank has
        # reached this point before the splits (which MPI offers only as blocking calls)
        local = node_comm(channel.comm, wait=channel.wait)
        cross = channel.comm.Split(local.Get_rank(), key=channel.rank)
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
    def uniform(self):
        """Whether every node holds the same number of ranks."""
        return len(set(self.node_sizes)) == 1

    def free(self):
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


def _delete_cache(comm, keyval, cache):
    for value in cache.values():
        try:
            free = getattr(value, "free", None)
            if free is not None:
                free()
        except Exception:  # pragma: no cover - the MPI library may be finalizing
            pass


def comm_cache(comm):
    """The dict ccl keeps on the user's communicator ``comm`` (freed with it).

    Holds the :class:`Channel` under ``"channel"`` and whatever else ccl keeps
    per communicator (the module-level functions' error-feedback state).
    Values with a ``free()`` method are freed when ``comm`` is.
    """
    global _KEYVAL
    with _CACHE_LOCK:
        if _KEYVAL is None:
            _KEYVAL = MPI.Comm.Create_keyval(delete_fn=_delete_cache)
        cache = comm.Get_attr(_KEYVAL)
        if cache is None:
            cache = _Cache()
            comm.Set_attr(_KEYVAL, cache)
        return cache


class _Cache(dict):
    """What ccl keeps on one communicator, with a lock for creating its entries."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()


def channel(comm):
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
    global _LAUNCH_CHECKED
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
    if not _LAUNCH_CHECKED:
        # after the channel's creation, whose agreement has checked every CCL_* variable
        # (CCL_SKIP_LAUNCH_CHECK among them) on every rank
        check_launch()
        _LAUNCH_CHECKED = True
    return ch


def private_duplicate(comm):
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
