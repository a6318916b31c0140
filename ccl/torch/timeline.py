"""Horovod's timeline: a Chrome trace (chrome://tracing, Perfetto) of ``ccl.torch``'s collectives.

While a timeline records, every tensor collective of this rank adds a
complete event (its name, kind, start and duration) and a ``NEGOTIATE``
event inside it for the agreement of the ranks on the call; the rest of
the event is the data on the wire (encode, transfer and decode for a
codec). :func:`~ccl.torch.stop_timeline` (collective) gathers every rank's events on
rank 0, which writes one trace file, one process row per rank.
``HOROVOD_TIMELINE=file.json`` starts one at :func:`~ccl.torch.init` and
writes it at :func:`~ccl.torch.shutdown`.

>>> import ccl.torch as hvd
>>> hvd.init()
>>> hvd.start_timeline("/dev/null")
>>> hvd.stop_timeline()
"""

import contextlib
import json
import threading
import time

__all__ = ["start_timeline", "write", "record", "phase", "active"]

_LOCK = threading.Lock()
_STATE = {"path": None, "events": None}


def active():
    """Whether a timeline is recording on this rank."""
    return _STATE["events"] is not None


def record(name, category, start, end, **args):
    """Add a complete event (times from ``time.perf_counter``) if a timeline records."""
    events = _STATE["events"]
    if events is not None:
        with _LOCK:
            events.append({"name": name, "cat": category, "ph": "X",
                           "ts": (start - _STATE["zero"]) * 1e6,
                           "dur": (end - start) * 1e6, "args": args})


@contextlib.contextmanager
def phase(name, category):
    """Time the enclosed code as an event ``name`` (when a timeline records)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        if _STATE["events"] is not None:
            record(name, category, start, time.perf_counter())


def start_timeline(file_path, mark_cycles=False):
    """Start recording this rank's collectives for a Chrome trace at ``file_path``.

    Parameters
    ----------
    file_path : str
        Where rank 0 writes the trace at :func:`~ccl.torch.stop_timeline`.
    mark_cycles : bool
        Accepted for Horovod's signature (ccl has no cycles to mark).

    Examples
    --------
    >>> import ccl.torch as hvd
    >>> hvd.init()
    >>> hvd.start_timeline("/dev/null")
    >>> hvd.stop_timeline()
    """
    del mark_cycles
    with _LOCK:
        # the wall clock at zero lets rank 0 line the ranks' rows up
        _STATE.update(path=str(file_path), events=[], zero=time.perf_counter(),
                      wall=time.time())


def write(comm):
    """Gather every rank's events on rank 0 and write the trace there (collective on ``comm``)."""
    with _LOCK:
        path, events, wall = _STATE["path"], _STATE["events"], _STATE.get("wall", 0.0)
        _STATE.update(path=None, events=None)
    gathered = comm.gather((path, wall, events), root=0)
    if comm.Get_rank() != 0:
        return
    path = next((p for p, _, _ in gathered if p), None)
    if path is None:
        return
    first = min(w for p, w, _ in gathered if p)
    trace = []
    for rank, (_, wall, events) in enumerate(gathered):
        trace.append({"name": "process_name", "ph": "M", "pid": rank,
                      "args": {"name": f"rank {rank}"}})
        for event in events or []:
            trace.append(dict(event, pid=rank, tid=0, ts=event["ts"] + (wall - first) * 1e6))
    with open(path, "w") as f:
        json.dump({"traceEvents": trace, "displayTimeUnit": "ms"}, f)
