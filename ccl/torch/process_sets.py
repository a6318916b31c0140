"""Horovod's process sets on MPI sub-communicators, and the thread that runs tensor collectives.

A :class:`ProcessSet` is a group of ranks that run collectives among
themselves (``hvd.allreduce(t, process_set=evens)``). Each one, the global
set included, gets its own MPI communicator, split once from ``ccl.torch``'s
private communicator when the set is added (a collective of every rank, as
in Horovod), and used afterwards by one thread only: the :class:`OpsEngine`
thread that runs every tensor collective of ``ccl.torch`` in the order this
rank submitted them. Where ranks submitted named collectives of a set in
different orders, the thread matches them by name first, as Horovod's
coordinator does (:mod:`ccl.torch.matching`).
"""

import collections
import queue
import threading

from mpi4py import MPI

from ..agreement import agree
from ..api import Communicator
from ..errors import MismatchError
from ..transport.waits import set_default_stall_period
from . import runtime as _runtime
from . import timeline
from .engine import Engine
from .horovod_env import stall_check, warn_ignored
from .matching import match

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
           "init", "ops_engine", "set_runtime"]


class ProcessSet:
    """A set of ranks (global ranks, sorted) that run collectives among themselves.

    Parameters
    ----------
    ranks_or_comm : sequence of int or mpi4py.MPI.Intracomm
        The global ranks of the set, or an MPI communicator whose ranks
        (translated to ``ccl.torch``'s communicator) form it.

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> hvd.init()
    >>> hvd.global_process_set.size() == hvd.size()
    True
    """

    def __init__(self, ranks_or_comm):
        self.process_set_id = None
        self._comm = None
        self._communicator = None
        self._runtime = None  # the members' optimizers (set_runtime), made on first use
        if isinstance(ranks_or_comm, MPI.Comm):
            self.ranks = None
            self.mpi_comm = ranks_or_comm
        else:
            self.ranks = sorted(int(r) for r in ranks_or_comm)
            self.mpi_comm = None

    def _resolve(self, runtime):
        """Turn a communicator into global ranks (its group translated, no communication)."""
        if self.mpi_comm is not None and self.ranks is None:
            if self.mpi_comm == MPI.COMM_NULL:
                raise ValueError("ProcessSet(comm) needs a communicator, not MPI.COMM_NULL")
            group, ours = self.mpi_comm.Get_group(), runtime.comm.Get_group()
            ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), ours)
            group.Free()
            ours.Free()
            if any(r == MPI.UNDEFINED for r in ranks):
                raise ValueError("ProcessSet(comm): the communicator holds ranks outside "
                                 "ccl.torch's communicator")
            self.ranks = sorted(ranks)

    def included(self):
        """Whether this rank belongs to the set.

        Returns
        -------
        bool
            True for members.
        """
        return _runtime.current().rank in self._members()

    def _members(self):
        if self.process_set_id == 0:
            return range(_runtime.current().size)
        return self.ranks or []

    def rank(self):
        """This rank's index in the set.

        Returns
        -------
        int
            0 to ``size() - 1``; -1 when this rank is not a member.
        """
        members = list(self._members())
        me = _runtime.current().rank
        return members.index(me) if me in members else -1

    def size(self):
        """Number of ranks in the set.

        Returns
        -------
        int
            The set's size.
        """
        return len(self._members())

    def __repr__(self):
        ranks = "all" if self.process_set_id == 0 else self.ranks
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={ranks})"


#: The set of every rank (id 0); ``process_set=`` defaults to it.
global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


class OpsEngine(Engine):
    """The thread of ``ccl.torch``'s tensor collectives, and the communicators of its sets."""

    def __init__(self, runtime):
        # a codec given as compression= compresses whatever the size: the user chose it
        super().__init__(runtime, None, "auto", "sum", min_compress_bytes=0)
        self.sets = {0: global_process_set}
        global_process_set.ranks = list(range(runtime.size))
        global_process_set._comm = self.comm
        global_process_set._communicator = self.communicator
        self.next_id = 1
        self.lock = threading.Lock()
        # generated names per (kind, set id): the same on every rank of a set that makes
        # the same calls (set ids are never reused within one runtime)
        self.auto_names = collections.Counter()
        self.timeline_comm = None
        self._inline = collections.deque()  # without a thread: the backlog wait() runs
        self._waiting = 0  # threads waiting for a collective (they submit nothing meanwhile)
        self._waiting_lock = threading.Lock()

    checks_steps = False  # single collectives, no steps (see Engine.checks_steps)

    def blocked(self):
        """Whether a caller waits for a collective (name matching's "no more submissions")."""
        return self._waiting > 0 or not self.threaded

    def serve(self, jobs):
        """The collectives' thread: run jobs in submission order, matching names where needed."""
        backlog = collections.deque()

        def pull():
            while True:
                try:
                    backlog.append(jobs.get_nowait())
                except queue.Empty:
                    return

        while True:
            if not backlog:
                backlog.append(jobs.get())
            if not self._run_first(backlog, pull):
                return

    def _run_first(self, backlog, pull):
        """Run the first job of ``backlog``; return False at the stop mark (None)."""
        job = backlog.popleft()
        if job is None:
            return False
        if job.run(self.communicator) is False:  # the ranks' next names differ
            backlog.appendleft(job)
            match(self.blocked, job.process_set, backlog, pull)
        return True

    def wait(self, job):
        """Block until ``job`` is done (running the backlog here without a thread)."""
        with self._waiting_lock:
            self._waiting += 1
        try:
            while not self.threaded and self._inline and not job.done.is_set():
                self._run_first(self._inline, lambda: None)
            job.done.wait()
        finally:
            with self._waiting_lock:
                self._waiting -= 1

    def drain(self):
        """Wait until every collective submitted so far is done."""
        marker = _Barrier()
        self.submit(marker)
        self.wait(marker)

    def join(self, timeout=None):
        """Also stop the threads of the process sets' optimizers (no MPI call)."""
        super().join(timeout)
        for process_set in list(self.sets.values()):
            if process_set._runtime is not None:
                process_set._runtime.stop_threads(timeout)

    def close(self):
        if self.closed:
            return
        error = None
        for _, process_set in sorted(self.sets.items()):
            try:
                _free_set_runtime(process_set)
            except MismatchError as exc:  # members still step: raised once all is freed
                error = error or exc
        super().close()
        if self.timeline_comm is not None:  # HOROVOD_TIMELINE: written at shutdown
            timeline.write(self.timeline_comm)
        for set_id, process_set in sorted(self.sets.items()):
            if set_id and process_set._comm is not None and not MPI.Is_finalized():
                process_set._comm.Free()
            process_set._comm = process_set._communicator = None
        self.sets = {}
        if error is not None:
            raise error


class _Barrier:
    """A job that does nothing: waiting for it waits for every job before it."""

    def __init__(self):
        self.done = threading.Event()

    def run(self, communicator):
        self.done.set()


_STATE = {"runtime": None, "engine": None}


def ops_engine():
    """The :class:`OpsEngine` of the current ``ccl.torch`` runtime (made at :func:`init`)."""
    runtime = _runtime.current()
    if _STATE["runtime"] is not runtime or _STATE["engine"].closed:
        # init() was not called through ccl.torch (or ccl.torch was re-initialised):
        # made here, at a collective every rank calls
        _STATE["runtime"], _STATE["engine"] = runtime, OpsEngine(runtime)
    return _STATE["engine"]


def init(comm=None, process_sets=None):
    """Initialise ``ccl.torch`` (collective), as Horovod's ``hvd.init``.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm or sequence of int, optional
        The ranks that train together (default ``MPI.COMM_WORLD``), or a list
        of ``COMM_WORLD`` ranks (as Horovod allows).
    process_sets : list of ProcessSet, optional
        Process sets to add now (see :func:`add_process_set`).

    Raises
    ------
    TypeError, ValueError
        As ``ccl.torch.runtime.init``, and for bad process sets.

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> hvd.init()
    >>> hvd.is_initialized()
    True
    """
    if comm is not None and not isinstance(comm, MPI.Comm):
        ranks = sorted(int(r) for r in comm)
        world = MPI.COMM_WORLD
        group = world.Get_group().Incl(ranks)
        comm = world.Create_group(group) if world.rank in ranks else None
        group.Free()
        if comm is None:
            return  # like Horovod: ranks outside the list stay uninitialised
    stall = stall_check()  # a bad value raises before any collective
    _runtime.init(comm)
    warn_ignored()
    set_default_stall_period(stall)
    engine = ops_engine()
    path = timeline.path_from_environment()
    if path and engine.timeline_comm is None:
        timeline.start_timeline(path)
        engine.timeline_comm = _runtime.current().comm
    for process_set in process_sets or []:
        add_process_set(process_set)


def add_process_set(process_set):
    """Add a process set (collective over every rank, members or not), as Horovod.

    Parameters
    ----------
    process_set : ProcessSet or sequence of int
        The set, or its global ranks.

    Returns
    -------
    ProcessSet
        The registered set (with its ``process_set_id``).

    Raises
    ------
    ValueError
        If the ranks are out of range, empty, or already form a set (on every rank).
    ccl.MismatchError
        If ranks passed different sets.

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> hvd.init()
    >>> evens = hvd.add_process_set(range(0, hvd.size(), 2))
    >>> evens.included() == (hvd.rank() % 2 == 0)
    True
    >>> hvd.remove_process_set(evens)
    True
    """
    runtime = _runtime.current()
    engine = ops_engine()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    ranks, error = None, None
    try:
        process_set._resolve(runtime)
        ranks = process_set.ranks
    except ValueError as exc:
        error = exc
    valid = bool(ranks) and all(0 <= r < runtime.size for r in ranks)
    if error is not None:
        pass
    elif not valid or len(set(ranks)) != len(ranks):
        error = ValueError(f"a process set holds distinct ranks in [0, {runtime.size}), "
                           f"got {ranks}")
    elif process_set.process_set_id is not None:
        error = ValueError(f"{process_set!r} is registered already")
    elif any(s.ranks == ranks for i, s in engine.sets.items() if i):
        error = ValueError(f"a process set with ranks {ranks} exists already")
    agree(runtime.comm, "add_process_set", [("ranks", ranks)], error)
    member = runtime.rank in ranks
    sub = runtime.comm.Split(0 if member else MPI.UNDEFINED, key=runtime.rank)
    with engine.lock:
        set_id, engine.next_id = engine.next_id, engine.next_id + 1
    if member:
        process_set._comm = sub
        process_set._communicator = Communicator(sub, min_compress_bytes=0)
    process_set.process_set_id = set_id
    engine.sets[set_id] = process_set
    return process_set


def remove_process_set(process_set):
    """Remove a process set added by :func:`add_process_set` (collective over every rank).

    Collectives submitted earlier are finished first.

    Parameters
    ----------
    process_set : ProcessSet
        The set.

    Returns
    -------
    bool
        True if it was removed, False if it was not registered (or is the global set).

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> hvd.init()
    >>> first = hvd.add_process_set([0])
    >>> hvd.remove_process_set(first), hvd.remove_process_set(first)
    (True, False)
    """
    runtime = _runtime.current()
    engine = ops_engine()
    set_id = getattr(process_set, "process_set_id", None)
    known = bool(set_id) and engine.sets.get(set_id) is process_set
    agree(runtime.comm, "remove_process_set", [("process_set_id", set_id if known else None)])
    if not known:
        return False
    engine.drain()
    del engine.sets[set_id]
    _free_set_runtime(process_set)
    if process_set._comm is not None:
        process_set._comm.Free()
    process_set._comm = process_set._communicator = None
    process_set.process_set_id = None
    return True


def set_comm(process_set):
    """``(communicator, ccl Communicator)`` of a set this rank belongs to, else raise ValueError."""
    engine = ops_engine()
    if process_set is None:
        process_set = global_process_set
    set_id = getattr(process_set, "process_set_id", None)
    if set_id is None or engine.sets.get(set_id) is not process_set:
        raise ValueError(f"{process_set!r} is not registered: call hvd.add_process_set() first")
    if process_set._comm is None:
        raise ValueError(f"rank {_runtime.current().rank} is not in {process_set!r}")
    return process_set


def set_runtime(process_set):
    """The members' runtime of ``process_set`` (collective over its members, on first use).

    Raises
    ------
    ValueError
        If the set is not registered or this rank is not a member (no
        collective: the members do not wait for it).
    """
    process_set = set_comm(process_set)
    if process_set._runtime is None:
        # MPI_Comm_create_group: only the members call it, on the calling thread's
        # communicator (the set's own is the OpsEngine thread's)
        parent = _runtime.current().comm
        group = parent.Get_group()
        members = group.Incl(process_set.ranks)
        group.Free()
        comm = parent.Create_group(members, tag=process_set.process_set_id)
        members.Free()
        process_set._runtime = _runtime.SetRuntime(comm)
    return process_set._runtime


def _free_set_runtime(process_set):
    """Free the set's optimizers and their communicator (collective over the members)."""
    runtime, process_set._runtime = process_set._runtime, None
    if runtime is None:
        return
    if MPI.Is_finalized():
        runtime.stop_threads(_runtime.EXIT_JOIN_SECONDS)
        return
    runtime.free()
