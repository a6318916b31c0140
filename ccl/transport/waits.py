"""Waiting for MPI requests: the deadline, the report that ends the job, the stall inspector.

Every wait of ccl polls its request instead of blocking in MPI, so that it can

* **end a hung job**: once the call's deadline (``timeout=`` or
  ``CCL_TIMEOUT``) has passed, the rank writes which collective it was in,
  what it was waiting for and for whom (world ranks), and aborts the job;
* **say who is late** (the *stall inspector*, after Horovod's): once a wait
  has lasted ``CCL_STALL_CHECK_SECONDS`` (default 60; 0 turns it off), the
  rank warns which ranks have not joined the collective it waits in, and
  warns again every period while it waits. Ranks that wait long tell each
  other so (a small message on a tag no collective uses, sent once a wait
  has lasted half the period), and the ranks that sent no such word are the
  ones named: they have not joined the collective, or are stuck inside it;
* **leave the core to the others**: between tests a waiting rank yields its
  core (see :data:`POLL_SPIN_S`).

:class:`Waiting` holds this for a communicator; ``ccl.transport.Channel``
is one (this module was ``ccl.waits`` before the transport became a
package; that name still works, with a ``DeprecationWarning``).
:func:`wait_for` waits the same way where no channel exists yet (while the
channel itself is being created).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import warnings

import numpy as np
from mpi4py import MPI

from .. import config, trace

__all__ = ["Waiting", "wait_for", "world_ranks", "stall_period", "set_default_stall_period",
           "POLL_SPIN_S", "POLL_SLEEP_MAX_S", "STALL_DEFAULT_S"]

#: Seconds a wait tests its request and yields the core between tests
#: (``sched_yield``), before it sleeps between them. Yielding lets a rank that
#: shares the core (more ranks than cores) compute the message being waited
#: for, which MPI's own blocking wait, spinning, holds up for a scheduler time
#: slice; sleeping from the start adds its sleeps to every short wait
#: (docs/benchmarks.md, "Latency").
POLL_SPIN_S = 0.01
#: The longest sleep between tests once a wait has lasted ``POLL_SPIN_S``:
#: a rank far ahead of its peers gives its core back, at this much latency.
POLL_SLEEP_MAX_S = 1e-3
#: Seconds of waiting before the stall inspector warns, unless
#: ``CCL_STALL_CHECK_SECONDS`` says otherwise.
STALL_DEFAULT_S = 60.0
#: Collectives between two drains of stall notices nobody read (see :meth:`Waiting.drain`).
DRAIN_EVERY = 64
_yield_core = getattr(os, "sched_yield", lambda: time.sleep(0))


_STALL = {"default": STALL_DEFAULT_S}


def stall_period() -> float:
    """Seconds after which a wait warns (``math.inf``: never), from ``CCL_STALL_CHECK_SECONDS``.

    A bad value is reported by the argument check of the collective (every
    variable is part of it); here it falls back to the default.
    """
    value = config.read_or_none("CCL_STALL_CHECK_SECONDS")
    return _STALL["default"] if value is None else value


def set_default_stall_period(seconds: float | None) -> None:
    """Use ``seconds`` (``math.inf``: never warn) where ``CCL_STALL_CHECK_SECONDS`` is unset.

    ``ccl.torch`` sets it from Horovod's ``HOROVOD_STALL_CHECK_TIME_SECONDS``
    and ``HOROVOD_STALL_CHECK_DISABLE``; None restores ``STALL_DEFAULT_S``.
    Channels read it when a collective begins.
    """
    _STALL["default"] = STALL_DEFAULT_S if seconds is None else float(seconds)


def world_ranks(comm: MPI.Comm) -> list[int]:
    """The ``MPI.COMM_WORLD`` rank of every rank of ``comm`` (local: no communication)."""
    size = comm.Get_size()
    group, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
    try:
        ranks = group.Translate_ranks(list(range(size)), world)
    finally:
        group.Free()
        world.Free()
    return [r if w == MPI.UNDEFINED else int(w) for r, w in enumerate(ranks)]


class Waiting:
    """Deadline-polled waits on ``self.comm``, with reports in world ranks.

    Subclasses set ``comm``, ``rank``, ``size``, ``timeout`` (seconds; None or
    ``math.inf``: forever), ``activity`` (what is running, for reports),
    ``calls`` (collectives started, the same count on every rank) and call
    :meth:`init_waiting` once.
    """

    # set by the subclass (declared for readers and type checkers)
    comm: MPI.Intracomm
    rank: int
    size: int
    timeout: float | None
    activity: str
    calls: int

    def init_waiting(self, scope: str | None = None) -> None:
        """Set up the reports' rank names and the stall notices (``scope``: e.g. "its node")."""
        self.world = world_ranks(self.comm)
        # on a communicator of every rank in world order, ranks are named plainly
        self._plain = self.world == list(range(MPI.COMM_WORLD.Get_size()))
        self.scope = scope
        self.stall = STALL_DEFAULT_S
        self._stall_tag = None
        self._notices: list[tuple[MPI.Request, np.ndarray]] = []  # stall notices in flight
        self._noticed = -1  # the call this rank last sent a notice for
        self._seen: dict[int, int] = {}  # rank -> the call it said it waits in, this call

    def who(self, rank: int) -> str:
        """``rank`` of this communicator, named by its world rank."""
        if self._plain:
            return f"rank {rank}"
        where = f" of {self.scope}" if self.scope else ""
        return f"world rank {self.world[rank]} (rank {rank} of {self.size}{where})"

    # ------------------------------------------------------------- deadline
    def _deadline(self):
        if self.timeout is None or math.isinf(self.timeout):
            return None
        return time.monotonic() + self.timeout

    def _abort(self, what, cause):
        me = (f"rank {self.rank} of {self.size}" if self._plain
              else self.who(self.rank))
        message = f"ccl: {me} {what} in {self.activity}; {cause}. Aborting the job."
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        self.comm.Abort(3)

    def _timed_out(self, what):
        missing, _ = self._missing()
        silent = (f" (no word from {', '.join(self.who(r) for r in missing)})"
                  if missing else "")
        self._abort(f"timed out after {self.timeout:g} s waiting for {what}{silent}",
                    "that rank may have died or hung, may have raised an exception in its "
                    "own code, or may have called a different collective")

    @contextlib.contextmanager
    def _reporting(self, what):
        # A peer that died mid-transfer can make MPI fail instead of block (e.g. MPICH's
        # shared-memory copy from a vanished process). The collective cannot be finished
        # on any rank, so report it like a timeout instead of raising on this rank only
        # while the others wait.
        try:
            yield
        except MPI.Exception as exc:
            # the class ("Other MPI error") and the innermost line of MPICH's error stack
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            error = MPI.Get_error_string(exc.Get_error_class())
            if len(lines) > 1:
                error = f"{error}: {lines[-1]}"
            self._abort(f"got an MPI error waiting for {what} ({error})",
                        "the MPI library could not complete the transfer, which usually means "
                        "a peer rank died")

    def wait(self, request: MPI.Request, what: str) -> None:
        """Wait for one request, polling against the deadline."""
        with self._reporting(what), trace.span("WIRE", "wait", what=what):
            self._poll(request.Test, what)

    def wait_spinning(self, request: MPI.Request, what: str) -> None:
        """Wait for one request without yielding the core (for timed waits), with the deadline."""
        with self._reporting(what):
            self._poll(request.Test, what, spin=True)

    def _poll(self, test, what, spin=False):
        """Call ``test()`` until it returns something true, and return that.

        Yields the core between tests for ``POLL_SPIN_S`` (always, with
        ``spin``), then sleeps between them (up to ``POLL_SLEEP_MAX_S``);
        aborts the job once the call's deadline has passed, and lets the
        stall inspector speak once the wait has lasted its period.
        """
        done = test()
        if done:
            return done
        deadline, start, pause = self._deadline(), time.monotonic(), 5e-5
        # the notices go out in time for the warning, and for the timeout's report
        notice_at = start + min(self.stall, deadline - start if deadline else math.inf) / 2
        warn_at = start + self.stall
        while True:
            done = test()
            if done:
                return done
            now = time.monotonic()
            if deadline is not None and now > deadline:
                self._timed_out(what)
            if now > notice_at:
                notice_at = math.inf
                self._send_notices()
            if now > warn_at:
                self._warn_stall(what, now - start)
                warn_at = now + self.stall
            if spin:
                continue
            if now - start < POLL_SPIN_S:
                _yield_core()
            else:
                time.sleep(pause)
                pause = min(2 * pause, POLL_SLEEP_MAX_S)

    # ------------------------------------------------------- stall inspector
    def _notice_tag(self):
        if self._stall_tag is None:
            # collectives' tags run below the upper bound: the bound itself is never one
            self._stall_tag = max(int(self.comm.Get_attr(MPI.TAG_UB) or 32767), 32767)
        return self._stall_tag

    def _send_notices(self):
        """Tell every other rank that this one waits in call ``calls`` (once per call)."""
        if self._noticed == self.calls or self.size == 1:
            return
        self._noticed = self.calls
        self._notices = [(r, buf) for r, buf in self._notices if not r.Test()]
        buf = np.array([self.calls], dtype=np.int64)
        for peer in range(self.size):
            if peer != self.rank:
                request = self.comm.Isend([buf, MPI.INT64_T], peer, self._notice_tag())
                self._notices.append((request, buf))

    def drain(self) -> dict[int, int]:
        """Receive the stall notices that arrived; return ``{rank: its call}``.

        Called by the stall inspector, and every ``DRAIN_EVERY`` collectives
        by the channel, so that notices of a stall that ended never pile up
        in the MPI library's queue of unexpected messages.
        """
        seen: dict[int, int] = {}
        status = MPI.Status()
        while True:
            message = self.comm.Improbe(MPI.ANY_SOURCE, self._notice_tag(), status)
            if message is None:
                return seen
            buf = np.empty(1, dtype=np.int64)
            message.Recv([buf, MPI.INT64_T])
            seen[status.Get_source()] = int(buf[0])

    def _missing(self):
        """``(ranks that sent no notice for this call, those of them in another call)``."""
        self._send_notices()
        self._seen.update(self.drain())
        joined = {r for r, call in self._seen.items() if call == self.calls}
        missing = [r for r in range(self.size) if r != self.rank and r not in joined]
        return missing, sorted(r for r in self._seen if r in missing)

    def _warn_stall(self, what, waited):
        missing, elsewhere = self._missing()
        text = (f"ccl: stall: {self.who(self.rank)} has waited {waited:.0f} s in "
                f"{self.activity} for {what}; ")
        if missing:
            text += (f"no word from {', '.join(self.who(r) for r in missing)}: they have not "
                     "joined this collective, or are stuck inside it")
        else:
            text += "every rank has joined it and waits too"
        if elsewhere:
            text += (f" ({', '.join(self.who(r) for r in elsewhere)} waited in another "
                     "collective of this communicator)")
        text += ". CCL_STALL_CHECK_SECONDS sets this period (0: off)."
        warnings.warn(text, RuntimeWarning, stacklevel=2)

    def forget_stalls(self) -> None:
        """Start a collective with no stall notices remembered (called as one begins)."""
        self._seen = {}
        if self.calls % DRAIN_EVERY == 0:
            self.drain()


class _Pending(Waiting):
    """A wait outside any channel (the channel's own creation)."""

    def __init__(self, comm, timeout, activity):
        self.comm, self.rank, self.size = comm, comm.Get_rank(), comm.Get_size()
        self.timeout, self.activity, self.calls = timeout, activity, -1
        self.init_waiting()
        self.stall = stall_period()

    def _missing(self):
        return [], []  # the user's communicator: ccl sends nothing on it

    def _send_notices(self):
        pass  # the user's communicator: ccl sends nothing on it that could match their receives

    def _warn_stall(self, what, waited):
        warnings.warn(f"ccl: stall: {self.who(self.rank)} has waited {waited:.0f} s for {what} "
                      f"in {self.activity}: some rank has not reached it. "
                      "CCL_STALL_CHECK_SECONDS sets this period (0: off).", RuntimeWarning,
                      stacklevel=2)


def wait_for(comm: MPI.Intracomm, request: MPI.Request, what: str, activity: str,
             timeout: float | None) -> None:
    """Wait for ``request`` on ``comm`` with the deadline and the report of a channel.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
    request : mpi4py.MPI.Request
    what : str
        What is awaited, for the report.
    activity : str
        What the rank is doing, for the report.
    timeout : float or None
        Seconds (None or ``math.inf``: forever).
    """
    _Pending(comm, timeout, activity).wait(request, what)
