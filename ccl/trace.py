"""Measured spans of this process's collectives, for a timeline (a Chrome trace).

While :func:`start` has been called and :func:`stop` not yet, the collective
engine records what each collective spends its time on, as complete events
(``"ph": "X"``) of the thread that runs it:

``<collective>``
    The whole call of :func:`ccl.collectives.plan.run` (``allreduce``,
    ``reduce_scatter``, ``allgather``), named by its key when it has one;
    its ``args`` hold the input bytes, the payload bytes this rank sent
    (``bytes_sent``, ``plain_bytes_sent``), the codec and the algorithm.
``NEGOTIATE``
    The ranks' agreement on the call (:func:`ccl.agreement.agree`).
``ENCODE`` / ``DECODE`` / ``ADD``
    One codec operation on one unit (a chunk or pipeline segment):
    :meth:`ccl.collectives.base.Call.encode`, its decodes, and a homomorphic
    codec's sum of two payloads.
``WIRE``
    A wait for the network: a blocking receive, or a wait for a
    nonblocking send or MPI collective to complete.

Events nest in time on their thread (a pipelined ring encodes the next
segment while the previous one is on the wire, so ``WIRE`` spans are only the
waits, not the whole transfer). When no trace records, each instrumented point
costs one attribute test. ``ccl.torch``'s timeline
(:func:`ccl.torch.start_timeline`) writes the events of every rank as one file.

>>> from ccl import trace
>>> trace.start()
>>> with trace.span("ENCODE", "codec", bytes=12):
...     pass
>>> [(e["name"], e["args"]) for e in trace.stop()["events"]]
[('ENCODE', {'bytes': 12})]
>>> trace.recording()
False
"""

import contextlib
import threading
import time

__all__ = ["start", "stop", "recording", "add", "span", "now"]

_LOCK = threading.Lock()
_NULL = contextlib.nullcontext()


class _State:
    events = None  # a list while recording
    zero = 0.0  # perf_counter at start (event times are microseconds after it)
    wall = 0.0  # time.time() at start, to line up the rows of several processes
    threads = {}  # thread ident -> (tid, name)


_STATE = _State()
now = time.perf_counter


def recording():
    """Whether a trace records in this process."""
    return _STATE.events is not None


def start():
    """Start recording (again, from no events); a trace already recording is dropped."""
    with _LOCK:
        _STATE.events, _STATE.threads = [], {}
        _STATE.zero, _STATE.wall = time.perf_counter(), time.time()


def stop():
    """Stop recording; return what was recorded (None if nothing recorded).

    Returns
    -------
    dict or None
        ``events`` (complete events with ``tid``, times in microseconds from
        the start), ``threads`` (``{tid: thread name}``) and ``wall`` (the
        ``time.time()`` of the start).
    """
    with _LOCK:
        events, threads = _STATE.events, _STATE.threads
        _STATE.events, _STATE.threads = None, {}
    if events is None:
        return None
    return {"events": events, "wall": _STATE.wall,
            "threads": {tid: name for tid, name in threads.values()}}


def _tid():
    ident = threading.get_ident()
    found = _STATE.threads.get(ident)
    if found is None:
        found = (len(_STATE.threads), threading.current_thread().name)
        _STATE.threads[ident] = found
    return found[0]


def add(name, category, begin, end, **args):
    """Record an event of this thread from ``begin`` to ``end`` (``perf_counter`` times)."""
    if _STATE.events is None:
        return
    with _LOCK:
        events = _STATE.events
        if events is not None:
            events.append({"name": name, "cat": category, "ph": "X", "tid": _tid(),
                           "ts": (begin - _STATE.zero) * 1e6, "dur": (end - begin) * 1e6,
                           "args": args})


class _Span:
    __slots__ = ("name", "category", "args", "begin")

    def __init__(self, name, category, args):
        self.name, self.category, self.args = name, category, args

    def __enter__(self):
        self.begin = time.perf_counter()
        return self.args

    def __exit__(self, *exc):
        add(self.name, self.category, self.begin, time.perf_counter(), **self.args)


def span(name, category, **args):
    """A context manager that records the enclosed code as an event (when recording).

    The ``args`` dict is what ``with`` binds: code inside may add entries
    (for example the bytes it moved) before the event is recorded.
    """
    if _STATE.events is None:
        return _NULL
    return _Span(name, category, args)
