"""Horovod's timeline: a Chrome trace (chrome://tracing, Perfetto) of ``ccl.torch``'s collectives.

While a timeline records, every collective of this rank adds measured events
(:mod:`ccl.trace`): one per ``hvd.*`` tensor collective (named as its tensor,
with a ``NEGOTIATE`` event inside for the ranks' agreement on the call and a
``WIRE`` event for the MPI library's transfer), and one per collective of
ccl's engine (``DistributedOptimizer``'s buckets, named by their key, and
tensors given a ccl codec as ``compression=``) with its ``NEGOTIATE``,
``ENCODE``, ``DECODE``, ``ADD`` and ``WIRE`` spans and the bytes it sent.
:func:`~ccl.torch.stop_timeline` (collective) gathers every rank's events on
rank 0, which writes one trace file: one process row per rank, one thread row
per thread that ran collectives. ``HOROVOD_TIMELINE=file.json`` (or its twin
``CCL_TIMELINE``, which wins when both are set) starts one at
:func:`~ccl.torch.init` and writes it at :func:`~ccl.torch.shutdown`.
``python -m ccl.bench.timeline_plot`` draws one.

>>> import ccl.torch as hvd
>>> hvd.init()
>>> hvd.start_timeline("/dev/null")
>>> hvd.stop_timeline()
"""

import json
import os

from .. import config, trace

__all__ = ["start_timeline", "write", "record", "phase", "active", "path_from_environment"]

_STATE = {"path": None}


def active():
    """Whether a timeline is recording on this rank."""
    return trace.recording()


def record(name, category, start, end, **args):
    """Add a complete event (times from ``time.perf_counter``) if a timeline records."""
    trace.add(name, category, start, end, **args)


def phase(name, category, **args):
    """Time the enclosed code as an event ``name`` (when a timeline records)."""
    return trace.span(name, category, **args)


def path_from_environment(environ=None):
    """The file ``CCL_TIMELINE`` or else ``HOROVOD_TIMELINE`` names, or None.

    >>> both = {"HOROVOD_TIMELINE": "a.json", "CCL_TIMELINE": "b.json"}
    >>> path_from_environment(both), path_from_environment({"HOROVOD_TIMELINE": "a.json"})
    ('b.json', 'a.json')
    """
    environ = os.environ if environ is None else environ
    return config.read("CCL_TIMELINE", environ) or (environ.get("HOROVOD_TIMELINE") or None)


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
    _STATE["path"] = str(file_path)
    trace.start()


def write(comm):
    """Gather every rank's events on rank 0 and write the trace there (collective on ``comm``)."""
    path, _STATE["path"] = _STATE["path"], None
    recorded = trace.stop()
    gathered = comm.gather((path, recorded), root=0)
    if comm.Get_rank() != 0:
        return
    path = next((p for p, _ in gathered if p), None)
    if path is None:
        return
    # the wall clocks at the starts line the ranks' rows up
    first = min(r["wall"] for _, r in gathered if r is not None)
    out = []
    for rank, (_, recorded) in enumerate(gathered):
        out.append({"name": "process_name", "ph": "M", "pid": rank,
                    "args": {"name": f"rank {rank}"}})
        if recorded is None:
            continue
        for tid, name in sorted(recorded["threads"].items()):
            out.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                        "args": {"name": name}})
        shift = (recorded["wall"] - first) * 1e6
        out.extend(dict(e, pid=rank, ts=e["ts"] + shift) for e in recorded["events"])
    with open(path, "w") as f:
        json.dump({"traceEvents": out, "displayTimeUnit": "ms"}, f)
