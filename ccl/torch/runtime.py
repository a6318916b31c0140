"""Topology of a ``ccl.torch`` job: ``init``, ``rank``, ``size``, ``local_rank``, ...

:func:`init` duplicates the user's communicator once. Everything ``ccl.torch``
does at the Python level (broadcasts, the optimizer's agreement checks) runs
on that duplicate, so it can never match the user's own messages. Each
:class:`~ccl.torch.DistributedOptimizer` (and each DDP hook) duplicates it
again for its own background thread, because two threads must never share one
communicator's message order. That duplicate is freed when its owner is
garbage-collected on every rank, at the next one made (a collective point),
or at :func:`shutdown`. A script may end without :func:`shutdown`: an exit
handler stops the threads before MPI is finalized.
"""

import atexit
import queue
import threading

from mpi4py import MPI

from ..errors import MismatchError
from ..launch import node_comm
from ..transport import private_duplicate

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
           "cross_rank", "cross_size", "threads_supported"]


class _Runtime:
    """The communicators of an initialised ``ccl.torch``."""

    def __init__(self, comm):
        self.user_comm = comm
        self.comm = private_duplicate(comm)  # its waits honour CCL_TIMEOUT
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        # ranks that share memory (or CCL_LOCAL_SIZE's blocks) form a node, in rank order
        self.local = node_comm(self.comm)
        self.local_rank = self.local.Get_rank()
        self.local_size = self.local.Get_size()
        # one rank per node with the same local rank: its rank is the node's index
        self.cross = self.comm.Split(self.local_rank, key=self.rank)
        self.cross_rank = self.cross.Get_rank()
        self.cross_size = self.cross.Get_size()
        # every live engine (optimizer or DDP hook) by its number, the same on every rank
        # since engines are made collectively: shutdown() frees them in that order
        self.engines = {}
        self.made = 0
        # numbers of engines whose owner was garbage-collected; a SimpleQueue because
        # finalizers may run in any thread, inside any code (put() is reentrant-safe)
        self.retired = queue.SimpleQueue()
        self._retired = set()

    def register(self, engine):
        """Number a new engine (made collectively, so the same number on every rank)."""
        number, self.made = self.made, self.made + 1
        self.engines[number] = engine
        return number

    def free_retired(self):
        """Free the engines of owners gone on every rank (collective, small).

        Freeing a communicator is collective in MPI, and each rank's garbage
        collector drops owners at its own time: the ranks first agree on the
        engines retired everywhere, then free those, in number order.
        """
        while True:
            try:
                self._retired.add(self.retired.get_nowait())
            except queue.Empty:
                break
        everywhere = set.intersection(*map(set, self.comm.allgather(sorted(self._retired))))
        for number in sorted(everywhere):
            self.engines.pop(number).close()
        self._retired -= everywhere

    def stop_threads(self, timeout):
        """Let every engine finish its queued jobs and stop its thread (no collective)."""
        for engine in list(self.engines.values()):
            engine.join(timeout)

    def free(self):
        error = None
        for number in sorted(self.engines):
            try:
                self.engines[number].close()
            except MismatchError as exc:  # other ranks still step: raised once all is freed
                error = error or exc
        self.engines.clear()
        for c in (self.cross, self.local, self.comm):
            if c != MPI.COMM_NULL and not MPI.Is_finalized():
                c.Free()
        if error is not None:
            raise error


class SetRuntime(_Runtime):
    """The runtime of one process set's optimizers: its members only.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        The members' communicator for the calling thread (freed by :meth:`free`).
        Engines are numbered, retired and freed among the members, as the
        runtime's are among every rank.
    """

    def __init__(self, comm):  # pylint: disable=super-init-not-called
        self.user_comm = None
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.local = self.cross = MPI.COMM_NULL  # free() frees self.comm alone
        self.engines, self.made = {}, 0
        self.retired, self._retired = queue.SimpleQueue(), set()


_LOCK = threading.Lock()
_RUNTIME = None


def init(comm=None):
    """Initialise ``ccl.torch`` on a duplicate of ``comm`` (collective).

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm, optional
        The ranks that train together (default ``MPI.COMM_WORLD``). It is
        duplicated, so ``ccl.torch``'s traffic never matches the caller's.

    Raises
    ------
    TypeError
        If ``comm`` is not an mpi4py intracommunicator.
    ValueError
        If ``ccl.torch`` is already initialised on another communicator (call
        :func:`shutdown` first). Calling ``init`` again with the same
        communicator, or with none, does nothing.

    Examples
    --------
    >>> import ccl.torch as ct
    >>> ct.init()
    >>> 0 <= ct.rank() < ct.size()
    True
    """
    global _RUNTIME
    if comm is not None and not isinstance(comm, MPI.Intracomm):
        raise TypeError(f"comm must be an mpi4py intracommunicator (e.g. MPI.COMM_WORLD), "
                        f"got {type(comm).__name__}")
    if comm is not None and comm == MPI.COMM_NULL:
        raise ValueError("comm is MPI.COMM_NULL")
    with _LOCK:
        if _RUNTIME is not None:
            if comm is None or comm == _RUNTIME.user_comm:
                return
            raise ValueError("ccl.torch is already initialised on another communicator; "
                             "call ccl.torch.shutdown() first")
        _RUNTIME = _Runtime(MPI.COMM_WORLD if comm is None else comm)


def shutdown():
    """Free ``ccl.torch``'s communicators (collective); later calls need :func:`init` again.

    Pending reductions of every :class:`~ccl.torch.DistributedOptimizer` are
    waited for and their background threads stopped; those optimizers cannot
    reduce gradients any more. Does nothing if not initialised. After
    ``MPI.Finalize()`` it makes no MPI call (MPI has released every
    communicator already): it only stops the background threads and forgets
    the runtime.

    Raises
    ------
    ccl.MismatchError
        If other ranks are starting another step of an optimizer or DDP hook
        instead (they took more steps than this rank): they raise it too,
        naming the ranks, instead of waiting forever. Everything is freed.

    Examples
    --------
    >>> import ccl.torch as ct
    >>> ct.init()
    >>> ct.shutdown()
    >>> ct.is_initialized()
    False
    """
    global _RUNTIME
    with _LOCK:
        runtime, _RUNTIME = _RUNTIME, None
    if runtime is None:
        return
    if MPI.Is_finalized():
        # freeing a communicator now would make the MPI library abort the process
        runtime.stop_threads(EXIT_JOIN_SECONDS)
        for engine in runtime.engines.values():
            engine.closed = True
        runtime.engines.clear()
        return
    runtime.free()


#: Seconds the exit handler waits for a communication thread's queued reductions.
EXIT_JOIN_SECONDS = 60


def _stop_threads_at_exit():
    """Stop the communication threads before MPI is finalized (without shutdown()).

    A script may end without :func:`shutdown`. mpi4py finalizes MPI after
    every ``atexit`` handler has run; this one runs before that and lets each
    engine's thread finish its queued reductions (every rank queued the same
    ones) and end, so that no thread is inside MPI, or woken up inside the
    interpreter's finalization, when MPI and the interpreter go away. It does
    not free communicators: ranks reach their exit at different times, and
    MPI_Finalize releases them.
    """
    runtime = _RUNTIME
    if runtime is not None:
        runtime.stop_threads(EXIT_JOIN_SECONDS)


# mpi4py is imported above, so this runs before its finalization (atexit is LIFO, and
# mpi4py finalizes through Py_AtExit, after all atexit handlers)
atexit.register(_stop_threads_at_exit)


def is_initialized():
    """Return whether :func:`init` was called (and :func:`shutdown` not since).

    Returns
    -------
    bool
        True between :func:`init` and :func:`shutdown`.

    Examples
    --------
    >>> import ccl.torch as ct
    >>> ct.init()
    >>> ct.is_initialized()
    True
    """
    return _RUNTIME is not None


def current():
    """Return the runtime, or raise if :func:`init` was not called."""
    runtime = _RUNTIME
    if runtime is None:
        raise RuntimeError("ccl.torch is not initialised: call ccl.torch.init() (or "
                           "ccl.torch.init(comm) with an mpi4py communicator) first")
    return runtime


def rank():
    """This process's rank in the communicator given to :func:`init`.

    Returns
    -------
    int
        0 to ``size() - 1``.

    Raises
    ------
    RuntimeError
        If :func:`init` was not called.

    Examples
    --------
    >>> import ccl.torch as ct
    >>> ct.init()
    >>> 0 <= ct.rank() < ct.size()
    True
    """
    return current().rank


def size():
    """Number of ranks in the communicator given to :func:`init`.

    Returns
    -------
    int
        The communicator's size.

    Raises
    ------
    RuntimeError
        If :func:`init` was not called.

    Examples
    --------
    >>> import ccl.torch as ct
    >>> ct.init()
    >>> from mpi4py import MPI
    >>> ct.size() == MPI.COMM_WORLD.size
    True
    """
    return current().size


def local_rank():
    """This process's rank among the ranks on its node (see :func:`ccl.launch.node_comm`).

    Nodes are the ranks that share memory, or consecutive blocks of
    ``CCL_LOCAL_SIZE`` ranks when that is set.

    Use it to pick a GPU: ``torch.cuda.set_device(ccl.torch.local_rank())``.

    Returns
    -------
    int
        0 to ``local_size() - 1``.

    Raises
    ------
    RuntimeError
        If :func:`init` was not called.

    Examples
    --------
    >>> import ccl.torch as ct
    >>> ct.init()
    >>> 0 <= ct.local_rank() < ct.local_size()
    True
    """
    return current().local_rank


def local_size():
    """Number of ranks on this process's node.

    Returns
    -------
    int
        Ranks of the communicator that share this node's memory.

    Raises
    ------
    RuntimeError
        If :func:`init` was not called.

    Examples
    --------
    >>> import ccl.torch as ct
    >>> ct.init()
    >>> 1 <= ct.local_size() <= ct.size()
    True
    """
    return current().local_size


def cross_rank():
    """Index of this process's node (its rank among ranks of the same local rank).

    Returns
    -------
    int
        0 to ``cross_size() - 1``.

    Raises
    ------
    RuntimeError
        If :func:`init` was not called.

    Examples
    --------
    >>> import ccl.torch as ct
    >>> ct.init()
    >>> 0 <= ct.cross_rank() < ct.cross_size()
    True
    """
    return current().cross_rank


def cross_size():
    """Number of nodes holding a rank with this process's local rank.

    Returns
    -------
    int
        The number of nodes, when every node runs the same number of ranks.

    Raises
    ------
    RuntimeError
        If :func:`init` was not called.

    Examples
    --------
    >>> import ccl.torch as ct
    >>> ct.init()
    >>> ct.cross_size() >= 1
    True
    """
    return current().cross_size


def threads_supported():
    """Return whether MPI allows the optimizer's background communication thread.

    That needs ``MPI_THREAD_MULTIPLE`` (mpi4py asks for it by default, and the
    PyPI MPI wheels provide it). Otherwise reductions run in the calling
    thread at ``synchronize()`` and do not overlap the backward pass.

    Returns
    -------
    bool
        ``MPI.Query_thread() >= MPI.THREAD_MULTIPLE``.

    Examples
    --------
    >>> import ccl.torch as ct
    >>> isinstance(ct.threads_supported(), bool)
    True
    """
    return MPI.Query_thread() >= MPI.THREAD_MULTIPLE
