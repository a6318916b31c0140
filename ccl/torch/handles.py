"""Handles of asynchronous tensor collectives: ``synchronize(handle)``, ``poll(handle)``.

Every tensor collective of ``ccl.torch`` (synchronous ones too) becomes an
:class:`Op` queued on the :class:`~ccl.torch.process_sets.OpsEngine` thread,
which runs them in submission order; ``*_async`` calls return the handle at
once, so the collective overlaps whatever the caller does next. Names are
Horovod's: given by the caller (``name=``) or generated per kind and process
set (``allreduce.noname.7``), the same on every rank that makes the same
calls. Ranks may submit named collectives in different orders: the engine
then agrees with the other ranks on which name goes first
(:mod:`ccl.torch.matching`), as Horovod's coordinator does. Two collectives
in flight under one name are an error, as in Horovod.
"""

import collections
import itertools
import threading
import time

from . import timeline
from .joins import NamesDiffer
from .process_sets import ops_engine, set_comm
from .runtime import current
from .tensor_ops import AutoName

__all__ = ["Op", "submit", "synchronize", "poll", "wait_all", "stop_timeline"]

_LOCK = threading.Lock()
_HANDLES = {}
_IN_FLIGHT = collections.Counter()
_NEXT = itertools.count(1)


class Op:
    """One queued collective: ``work(process_set)`` runs in the collectives' thread."""

    __slots__ = ("work", "process_set", "flight", "post", "result", "error", "done", "label")

    def __init__(self, work, process_set, flight, post):
        self.work, self.process_set, self.flight, self.post = work, process_set, flight, post
        self.result = self.error = None
        self.done = threading.Event()
        self.label = None  # (kind, name) for the timeline

    def run(self, communicator):
        """Called by the engine (``communicator`` is unused: the set has its own).

        Returns
        -------
        bool
            False when the ranks' next collectives had different names: nothing
            ran, and the engine matches the names (:mod:`ccl.torch.matching`)
            before running it again.
        """
        start = time.perf_counter()
        try:
            self.result = self.work(self.process_set)
        except NamesDiffer:
            return False
        except BaseException as exc:  # handed to synchronize()
            self.error = exc
        self._finish(start)
        return True

    def fail(self, error):
        """End the collective with ``error`` without running it (the engine's matching)."""
        self.error = error
        self._finish(None)

    def _finish(self, start):
        if start is not None and self.label is not None and timeline.active():
            kind, name = self.label
            timeline.record(name, kind, start, time.perf_counter(),
                            process_set=self.process_set.process_set_id,
                            failed=self.error is not None)
        if self.flight is not None:
            with _LOCK:
                _IN_FLIGHT[self.flight] -= 1
                if not _IN_FLIGHT[self.flight]:
                    del _IN_FLIGHT[self.flight]
        self.done.set()


def submit(kind, name, process_set, work, error=None, post=None):
    """Queue a collective; return its handle.

    Parameters
    ----------
    kind : str
        ``"allreduce"``, ``"allgather"``, ... (for generated names).
    name : str or None
        The caller's name, or None to generate one.
    process_set : ProcessSet
        The set it runs on (this rank must be a member).
    work : callable
        ``work(process_set, name, error)`` runs in the collectives' thread and
        returns the result; it must agree with the set's ranks first, passing
        ``error``.
    error : Exception, optional
        This rank's argument error, raised there (the other ranks raise too).
    post : callable, optional
        Applied to the result by :func:`synchronize` (in the caller's thread).

    Returns
    -------
    int
        The handle.

    Raises
    ------
    ValueError
        If this rank is not in ``process_set``, or ``name`` is in flight
        already (the queued call then fails on every rank of the set).
    """
    process_set = set_comm(process_set)
    engine = ops_engine()
    with _LOCK:
        if name is None:
            key = (kind, process_set.process_set_id)
            name = AutoName(f"{kind}.noname.{engine.auto_names[key]}")
            engine.auto_names[key] += 1
        flight = (process_set.process_set_id, str(name))
        duplicate = _IN_FLIGHT[flight] > 0
        if duplicate:
            flight = None  # the name stays the first call's
        else:
            _IN_FLIGHT[flight] += 1
    if duplicate:
        error = ValueError(f"a collective named {name!r} is in flight already: names of "
                           "concurrent collectives must differ")
    op = Op(lambda ps: work(ps, name if isinstance(name, AutoName) else str(name), error),
            process_set, flight, post)
    op.label = (kind, str(name))
    engine.submit(op)
    if duplicate:
        raise error  # the queued op fails everywhere in the set, so no rank waits for it
    handle = next(_NEXT)
    with _LOCK:
        _HANDLES[handle] = op
    return handle


def _take(handle):
    with _LOCK:
        op = _HANDLES.pop(handle, None)
    if op is None:
        raise ValueError(f"unknown handle {handle!r} (synchronized already?)")
    return op


def synchronize(handle):
    """Wait for an asynchronous collective and return its result.

    Parameters
    ----------
    handle : int
        What an ``*_async`` call returned.

    Returns
    -------
    torch.Tensor or list or tuple
        The output (a list for grouped calls, ``(output, received_splits)``
        for ``alltoall_async``).

    Raises
    ------
    ValueError
        For an unknown handle.
    Exception
        What the collective raised (on every rank of its set alike).

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> h = hvd.allreduce_async(torch.ones(2), op=hvd.Sum)
    >>> hvd.synchronize(h).tolist() == [float(hvd.size())] * 2
    True
    """
    op = _take(handle)
    ops_engine().wait(op)
    if op.error is not None:
        raise op.error
    return op.post(op.result) if op.post is not None else op.result


def poll(handle):
    """Return whether an asynchronous collective is done (``synchronize`` will not wait).

    Parameters
    ----------
    handle : int
        What an ``*_async`` call returned.

    Returns
    -------
    bool
        True once the collective finished (successfully or not).

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> h = hvd.allreduce_async(torch.ones(1))
    >>> hvd.poll(h) in (True, False)
    True
    >>> hvd.synchronize(h).item()
    1.0
    """
    with _LOCK:
        op = _HANDLES.get(handle)
    if op is None:
        raise ValueError(f"unknown handle {handle!r} (synchronized already?)")
    engine = ops_engine()
    if not engine.threaded:  # without a thread, collectives run when waited for
        engine.wait(op)
    return op.done.is_set()


def wait_all():
    """Wait for every queued collective of this rank (results stay with their handles)."""
    ops_engine().drain()


def stop_timeline():
    """Stop recording; rank 0 writes every rank's events to the trace file (collective).

    Collectives submitted before are finished first. Does nothing where no
    timeline was started on any rank.

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> hvd.init()
    >>> hvd.stop_timeline()
    """
    ops_engine().drain()
    timeline.write(current().comm)
