"""Horovod's ``join()``: a rank that ran out of work takes part in the others' allreduces.

Every tensor collective of the global process set starts with one exchange of
fixed-size rows (:func:`negotiate`): the call's fingerprint (what, name, op,
shapes, dtypes, ...) from each rank, or a "joined" row from a rank waiting
in :func:`join_work`. While some ranks have joined:

* an allreduce (``Sum`` or ``Average``, no codec) goes ahead: the first
  active rank broadcasts the call's shapes and dtypes as JSON, the joined
  ranks contribute zeros (an average still divides by the set's size, as
  Horovod does);
* any other collective (allgather, broadcast, alltoall, ...) raises
  :class:`~ccl.torch.HorovodInternalError` on every active rank, and the
  joined ranks keep waiting;
* once every rank sent a joined row, ``join`` returns on every rank with
  the rank that joined last.

Meanwhile the joined rank's own thread takes part in the other ranks'
``DistributedOptimizer`` steps with zeros (:func:`serve_steps`).

So no rank hangs: a joined rank answers every exchange the others start.

>>> import torch, ccl.torch as hvd
>>> hvd.init()
>>> if hvd.rank() < hvd.size() - 1 or hvd.size() == 1:  # the last rank ran out of data
...     out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="more")
>>> last = hvd.join()
>>> last != hvd.size() - 1 or hvd.size() == 1
True
"""

import json
import threading
import time

import numpy as np
import torch
from mpi4py import MPI

from ..agreement import agreement_row, field_crc, verdict
from .engine import JoinCheck

__all__ = ["negotiate", "join_work", "serve_steps", "zeros_of", "JoinedError", "NamesDiffer",
           "MAX_FIELDS"]

#: fields of a collective's fingerprint (the call's kind comes first)
MAX_FIELDS = 7
# columns after the agreement row: joined flag, rounds spent joined, join time (microseconds)
_WIDTH = 1 + MAX_FIELDS
_JOINED, _ROUNDS, _TIME = _WIDTH, _WIDTH + 1, _WIDTH + 2
_ALLREDUCE = field_crc("allreduce")


class JoinedError(RuntimeError):
    """A collective other ranks cannot join: some ranks called ``join()`` already."""


class NamesDiffer(Exception):
    """The ranks' next collectives have different names: the engine matches them by name.

    Raised on every rank alike (from the same exchanged rows) before any data
    moves, so the call is simply run again once the ranks agreed on which
    named collective goes first (:mod:`ccl.torch.matching`).
    """


def _names_differ(fields, rows):
    """Whether the ranks' rows differ in the ``name`` field (the same verdict everywhere)."""
    column = next((1 + i for i, (field, _) in enumerate(fields) if field == "name"), None)
    return column is not None and not (rows[:, column] == rows[0, column]).all()


def _exchange(comm, row):
    rows = np.empty((comm.Get_size(), row.size), dtype=np.int64)
    comm.Allgather([row, MPI.INT64_T], [rows, MPI.INT64_T])
    return rows


def _row(fields, error, joined=False, rounds=0, stamp=0):
    row = np.zeros(_WIDTH + 3, dtype=np.int64)
    if not joined:
        row[:1 + len(fields)] = agreement_row(fields, error)
    row[_JOINED], row[_ROUNDS], row[_TIME] = int(joined), rounds, stamp
    return row


def _consistent(active_rows):
    """Whether the active ranks agree (no error code, equal fingerprints)."""
    return not active_rows[:, 0].any() and bool((active_rows == active_rows[0]).all())


def _bcast_json(comm, value, root):
    data = np.frombuffer(json.dumps(value).encode("utf-8"), dtype=np.uint8) \
        if comm.Get_rank() == root else None
    length = np.array([0 if data is None else data.size], dtype=np.int64)
    comm.Bcast([length, MPI.INT64_T], root=root)
    buf = data.copy() if data is not None else np.empty(int(length[0]), dtype=np.uint8)
    comm.Bcast([buf, MPI.BYTE], root=root)
    return json.loads(buf.tobytes().decode("utf-8"))


def negotiate(comm, what, fields, error, describe=None):
    """Agree on one collective with the ranks of ``comm`` (collective; joined ranks answer).

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        The global set's communicator.
    what : str
        The collective (``"allreduce"``, ``"allgather"``, ...).
    fields : sequence of (str, object)
        What must be equal on every rank (at most ``MAX_FIELDS - 1``).
    error : Exception or None
        This rank's own argument error.
    describe : callable, optional
        For an allreduce: returns ``{"ok": bool, "reason": str, "tensors":
        [[dtype, shape], ...], "op": int, "prescale": float, "postscale":
        float}``, what joined ranks need to contribute zeros.

    Returns
    -------
    list of int
        The ranks that have joined (empty in the common case).

    Raises
    ------
    NamesDiffer
        If no rank has joined and the ranks' collectives have different names.
    ccl.MismatchError
        If active ranks disagree otherwise (as :func:`ccl.agreement.agree`).
    JoinedError
        If ranks have joined and this collective cannot go ahead without them.
    """
    fields = [("collective", what)] + list(fields)
    row = _row(fields, error)
    rows = _exchange(comm, row)
    joined = np.flatnonzero(rows[:, _JOINED])
    if not joined.size:
        if _names_differ(fields, rows):
            raise NamesDiffer(what)
        verdict(comm, what, fields, row[:_WIDTH], rows[:, :_WIDTH], error)
        return []
    active = np.flatnonzero(rows[:, _JOINED] == 0)
    verdict(comm, what, fields, row[:_WIDTH], rows[active, :_WIDTH], error, ranks=active)
    joined = joined.tolist()
    if what != "allreduce":
        raise JoinedError(f"{what}: rank(s) {joined} called join() already; only allreduce "
                          "goes ahead while ranks have joined (they contribute zeros)")
    root = int(active[0])
    spec = describe() if comm.Get_rank() == root else None
    spec = _bcast_json(comm, spec, root)
    if not spec["ok"]:
        raise JoinedError(f"allreduce: rank(s) {joined} called join() already, and "
                          f"{spec['reason']}")
    return joined


def join_work(comm, allreduce_zeros, stamp=None):
    """The joined rank's side: answer exchanges until every rank joined (collective).

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        The global set's communicator.
    allreduce_zeros : callable
        ``allreduce_zeros(spec)`` takes part in an allreduce the active ranks
        agreed on, contributing zeros (``spec`` as from ``describe``).
    stamp : int, optional
        When this rank called ``join`` (microseconds of ``time.time()``;
        default: now). The caller's clock, not this thread's: the
        collectives' thread may start the work only after this rank already
        served other ranks' optimizer steps.

    Returns
    -------
    int
        The rank that joined last: the fewest rounds spent joined, then the
        latest clock, then the highest rank.
    """
    rounds = 0
    stamp = int(time.time() * 1e6) if stamp is None else int(stamp)
    while True:
        rows = _exchange(comm, _row([], None, joined=True, rounds=rounds, stamp=stamp))
        if rows[:, _JOINED].all():
            keys = [(-int(r[_ROUNDS]), int(r[_TIME]), rank) for rank, r in enumerate(rows)]
            return max(keys)[2]
        rounds += 1
        active = np.flatnonzero(rows[:, _JOINED] == 0)
        if rows[active[0], 1] != _ALLREDUCE or not _consistent(rows[active, :_WIDTH]):
            continue  # the active ranks raise; nothing moves
        spec = _bcast_json(comm, None, int(active[0]))
        if spec["ok"]:
            allreduce_zeros(spec)


def zeros_of(spec):
    """The zero tensors a joined rank contributes to an allreduce ``spec``."""
    return [torch.zeros(shape, dtype=getattr(torch, dtype.split(".")[-1]))
            for dtype, shape in spec["tensors"]]


def serve_steps(runtime):
    """The joined rank's part in the others' ``DistributedOptimizer`` steps (collective).

    Each live optimizer of ``runtime`` gets a :class:`~ccl.torch.engine.JoinCheck`
    in its engine (its own thread and communicator): when the other ranks
    start a step there, this rank takes part with zeros (the owner's
    ``joined_step``) and answers the next check; an optimizer is done once
    every rank joined (or some freed it). Several optimizers' steps are
    served in the order they complete their checks; steps that start
    together (one backward for two optimizers) are served in the order the
    optimizers were made.

    Parameters
    ----------
    runtime : object
        ``ccl.torch``'s runtime (``ccl.torch.runtime.current()``).
    """
    engines = [engine for _, engine in sorted(runtime.engines.items())
               if engine.checks_steps and not engine.closed and not engine.gone]
    ready = threading.Event()

    def owner_step(engine):
        return engine.joined_step() if engine.joined_step is not None else None

    def check(engine):
        job = JoinCheck(engine.what, owner_step(engine) is not None, lambda _: ready.set())
        engine.submit(job)
        return job

    checks = {i: check(engine) for i, engine in enumerate(engines)}
    while checks:
        done = [i for i in sorted(checks) if checks[i].done.is_set()]
        if not done:
            ready.wait()
            ready.clear()
            continue
        for i in done:
            job, engine = checks.pop(i), engines[i]
            if job.error is not None and getattr(job.error, "stopped", None):
                continue  # some rank freed the optimizer: no further step there
            if job.error is None and not job.stepping:
                continue  # every rank joined (or some freed it)
            step = owner_step(engine) if job.error is None else None
            if step is not None:
                try:
                    step(job)
                except Exception:  # the stepping ranks raise it in their step: serve on
                    pass
            checks[i] = check(engine)
