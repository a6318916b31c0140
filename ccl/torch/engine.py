"""The communication side of ``ccl.torch``: a private communicator and one background thread.

An :class:`Engine` runs :class:`Job` objects (one bucket's allreduce each)
strictly in the order they were submitted, the same order on every rank, on a
duplicate of ``ccl.torch``'s communicator that no other thread uses. Without
``MPI_THREAD_MULTIPLE`` the jobs run in the calling thread when waited for.
"""

import queue
import threading

import numpy as np
from mpi4py import MPI

from ..api import Communicator
from ..errors import MismatchError
from ..transport import channel
from .runtime import threads_supported

__all__ = ["Job", "Census", "StepCheck", "JoinCheck", "Engine", "release", "check_step",
           "exact_sum", "STEP", "CLOSE", "JOINED", "decision_stats"]

#: What a rank does in a step check: starts a step, frees its engine (shutdown), or
#: waits in ``join()``, ready to take part in the others' steps with zeros.
STEP, CLOSE, JOINED = 1, 2, 3


class Job:
    """One bucket's reduction: input, options, and the result or error once done."""

    counted = True  # in Engine.reductions

    __slots__ = ("x", "key", "codec", "algorithm", "lr", "result", "error", "done", "on_done",
                 "gate")

    def __init__(self, x, key, codec=None, algorithm=None, on_done=None, lr=None):
        self.x, self.key, self.codec, self.algorithm = x, key, codec, algorithm
        self.lr = lr  # the learning rate of lr-corrected error feedback (None: not corrected)
        self.result = self.error = None
        self.done = threading.Event()
        self.on_done = on_done  # called with the job once it is done, in the thread that ran it
        # the StepCheck of the job's step: once it failed (on every rank alike), the job
        # does not run its collective, since ranks at different steps would pair wrongly
        self.gate = None

    def run(self, communicator):
        try:
            if self.gate is not None and self.gate.error is not None:
                raise self.gate.error
            if self.lr is not None:  # lr-corrected error feedback, on the thread that reduces
                communicator.set_lr(self.lr)
            self.result = self.reduce(communicator)
        except BaseException as exc:  # handed to the thread that waits for the job
            self.error = exc
        finally:
            self.done.set()
        if self.on_done is not None:
            self.on_done(self)

    def reduce(self, communicator):
        """The job's collective: a keyed allreduce of ``communicator``."""
        return communicator.allreduce(self.x, key=self.key, codec=self.codec,
                                      algorithm=self.algorithm)


class Census(Job):
    """A small exact mean of the step's bookkeeping (not a reduction, nor a call in stats)."""

    __slots__ = ()
    counted = False

    def reduce(self, communicator):
        """The MPI library's exact mean of ``x`` over the ranks."""
        return exact_sum(communicator, self.x, "the step's bookkeeping") / communicator.size


def exact_sum(communicator, row, what):
    """The MPI library's exact sum of a float64 ``row`` on ``communicator``'s channel.

    Bookkeeping, not data: it is not counted in ``communicator.stats()``, and
    its wait honours the timeout (collective).

    Parameters
    ----------
    communicator : ccl.Communicator
    row : numpy.ndarray
        float64.
    what : str
        What the ranks wait for, for a timeout's report.

    Returns
    -------
    numpy.ndarray
    """
    ch, out = channel(communicator.comm), np.empty_like(row)
    ch.wait(ch.comm.Iallreduce(row, out, op=MPI.SUM), what)
    return out


class StepCheck(Job):
    """The check each step starts with: every rank is at the same step (collective).

    Parameters
    ----------
    what : str
        The owner, for messages (``"DistributedOptimizer"``, ...).
    kind : {STEP, CLOSE}
        Whether this rank starts a step or frees the engine.
    number : int
        The steps this rank's owner completed.
    """

    __slots__ = ("what", "kind", "number")
    counted = False

    def __init__(self, what, kind, number):
        super().__init__(None, None)
        self.what, self.kind, self.number = what, kind, number

    def run(self, communicator):
        try:
            self.result = check_step(communicator, self.what, self.kind, self.number)
        except BaseException as exc:  # handed to the thread that waits for the check
            self.error = exc
        finally:
            self.done.set()
        if self.on_done is not None:
            self.on_done(self)


class JoinCheck(StepCheck):
    """A rank in ``join()`` answers the step check of the other ranks' next step.

    Its ``result`` is the table of every rank's (kind, step) once done: the
    ranks' next step (some rank's kind is ``STEP``), or none (every rank
    joined, or some freed the engine).

    Parameters
    ----------
    what : str
        The owner, for messages.
    able : bool
        Whether the owner can take part in a step with zeros; if not, the
        stepping ranks raise.
    on_done : callable
        Called with the check once done, in the engine's thread.
    """

    __slots__ = ()

    def __init__(self, what, able, on_done):
        super().__init__(what, JOINED, 0 if able else -1)
        self.on_done = on_done

    @property
    def stepping(self):
        """Whether other ranks started a step (this rank then takes part with zeros)."""
        return self.error is None and STEP in self.result[0]

    @property
    def peers_closed(self):
        """Whether some rank freed the engine (no step check follows on it)."""
        return self.error is None and CLOSE in self.result[0]


def _ranks(ranks):
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def check_step(communicator, what, kind, number):
    """Compare every rank's step with one exact allreduce (collective).

    Parameters
    ----------
    communicator : ccl.Communicator
        The engine's communicator.
    what : str
        The owner, for messages.
    kind : {STEP, CLOSE}
        Whether this rank starts a step or frees the engine.
    number : int
        The steps this rank's owner completed.

    Returns
    -------
    tuple of list of int
        Every rank's kind and step (ranks in ``join()`` send ``JOINED``; their
        steps are not compared).

    Raises
    ------
    ccl.MismatchError
        On every rank, naming the ranks and their steps, when ranks start
        different steps or some free the engine while the others start a
        step (its ``stopped`` attribute then lists those ranks), or when a
        rank in ``join()`` cannot take part in the owner's steps.
    """
    size, rank = communicator.size, communicator.rank
    row = np.zeros(2 * size)
    row[rank], row[size + rank] = kind, number
    # The MPI library's exact Allreduce: the ranks' rows are disjoint, so the sum is the
    # table of every rank's (kind, step), the same on every rank.
    table = exact_sum(communicator, row, f"every rank's step ({what})")
    kinds, numbers = np.rint(table[:size]).astype(int), np.rint(table[size:]).astype(int)
    closing = [r for r in range(size) if kinds[r] == CLOSE]
    stepping = [r for r in range(size) if kinds[r] == STEP]
    unable = [r for r in range(size) if kinds[r] == JOINED and numbers[r] < 0]
    table = (kinds.tolist(), numbers.tolist())
    steps = numbers[stepping]
    if not stepping or (not closing and not unable and (steps == steps[0]).all()):
        return table
    if unable and not closing:
        raise MismatchError(
            f"{_ranks(unable)} called join(), and {what} cannot take part in the other ranks' "
            "steps with zeros there: only a DistributedOptimizer can", field="step",
            ranks=[unable, stepping])
    if closing:
        last = sorted({int(numbers[r]) for r in closing})
        error = MismatchError(
            f"{_ranks(closing)} stopped after step {', '.join(map(str, last))} of {what} "
            f"(ccl.torch.shutdown()) while {_ranks(stepping)} started step "
            f"{int(numbers[stepping[0]]) + 1}: every rank must take the same number of steps "
            "(give every rank the same number of batches, e.g. drop the uneven remainder "
            "of a [rank::size] shard)", field="step", ranks=[closing, stepping])
        error.stopped = closing
        raise error
    groups = {}
    for r in stepping:
        groups.setdefault(int(numbers[r]), []).append(r)
    where = "; ".join(f"{_ranks(ranks)} at step {n + 1}" for n, ranks in groups.items())
    raise MismatchError(
        f"ranks are at different steps of {what}: {where}. Every rank must take the same "
        "number of steps, and a checkpoint must be loaded on every rank or on none",
        field="step", ranks=list(groups.values()))


def _serve(jobs, communicator):
    """The communication thread: run jobs in the order they were submitted."""
    while True:
        job = jobs.get()
        if job is None:
            return
        job.run(communicator)


class Engine:
    """A private communicator, its :class:`ccl.Communicator` and thread (collective).

    Parameters
    ----------
    runtime : object
        The initialised ``ccl.torch`` (``ccl.torch.runtime.current()``); its
        communicator is duplicated.
    codec, algorithm, op
        Defaults of the :class:`ccl.Communicator`.
    **options
        Further :class:`ccl.Communicator` arguments.
    """

    #: An owner that takes steps (an optimizer, a DDP hook) tells the other ranks, when it is
    #: freed, at which step it stopped (a :class:`StepCheck`); one that runs single
    #: collectives (Horovod's API) has no steps to check, and other ranks need not free it
    #: at the same point of their training.
    checks_steps = True

    #: The owner's part in other ranks' steps while this rank is in ``join()``: a
    #: ``weakref.WeakMethod`` of ``joined_step(check)`` (None: the owner cannot take part).
    joined_step = None

    def __init__(self, runtime, codec, algorithm, op, **options):
        # Engines of optimizers (or hooks) gone since the last one was made: freed
        # now, at a point every rank reaches in the same order.
        runtime.free_retired()
        # A communicator of its own: this engine's thread must never share a
        # communicator's message order with another thread (collective).
        self.comm = runtime.comm.Dup()
        self.communicator = Communicator(self.comm, codec, algorithm=algorithm, op=op, **options)
        self.reductions = 0
        self.closed = False
        self.what = "ccl.torch"  # the owner, for the step check's messages
        self.steps = 0  # the steps the owner completed (the owner counts them)
        self.last_check = None  # the last StepCheck submitted
        self.gone = False  # the owner was garbage-collected (retire())
        self._jobs = queue.SimpleQueue()
        self._inline = []
        self._thread = None
        if threads_supported():
            self._thread = threading.Thread(target=self.serve, args=(self._jobs,),
                                            name="ccl.torch-comm", daemon=True)
            self._thread.start()
        self.retired = runtime.retired
        self.number = runtime.register(self)

    def serve(self, jobs):
        """The communication thread's loop: run ``jobs`` in the order they were submitted."""
        _serve(jobs, self.communicator)

    @property
    def threaded(self):
        """Whether jobs run in the background thread (else in :meth:`wait`'s caller)."""
        return self._thread is not None

    def submit(self, job):
        """Queue a job; jobs run in submission order."""
        if self.closed:
            raise RuntimeError("ccl.torch was shut down: this optimizer (or DDP hook) cannot "
                               "reduce gradients any more")
        if isinstance(job, StepCheck):
            self.last_check = job
        self.reductions += getattr(job, "counted", True)  # bookkeeping jobs say False
        if self._thread is None:
            self._inline.append(job)  # run by wait(), in the calling thread
        else:
            self._jobs.put(job)

    def wait(self, job):
        """Block until ``job`` is done."""
        while self._inline and not job.done.is_set():
            self._inline.pop(0).run(self.communicator)
        job.done.wait()

    def stop(self):
        """Stop the thread once the queued jobs are done (no MPI calls: safe anywhere)."""
        if self._thread is not None and self._thread.is_alive():
            self._jobs.put(None)

    def retire(self):
        """The owner is gone: stop the thread, free the communicator at the next collective point.

        Safe in a finalizer (no MPI call, no lock).
        """
        self.stop()
        self.gone = True  # join() no longer serves it
        self.retired.put(self.number)

    def join(self, timeout=None):
        """Stop the thread once its queued jobs are done and wait for it (no MPI call here)."""
        self.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def close(self):
        """Finish queued jobs, stop the thread and free the communicator (collective).

        Raises
        ------
        ccl.MismatchError
            If other ranks start a step instead (they raise it too): the
            communicator is freed all the same.
        """
        if self.closed:
            return
        self.closed = True
        self.join()
        for job in self._inline:
            job.run(self.communicator)
        self._inline = []
        # tells ranks still stepping that this rank stopped (else they would wait forever)
        stopped = self.last_check is not None and (
            getattr(self.last_check.error, "stopped", None)
            or getattr(self.last_check, "peers_closed", False))
        check = None
        if self.checks_steps and not stopped and not MPI.Is_finalized():
            check = StepCheck(self.what, CLOSE, self.steps)
            if self._thread is None:
                check.run(self.communicator)
            else:  # in a thread named as the one the step checks ran in (ccl agrees on it)
                thread = threading.Thread(target=check.run, args=(self.communicator,),
                                          name=self._thread.name, daemon=True)
                thread.start()
                thread.join()
        self.comm.Free()
        if check is not None and check.error is not None:
            raise check.error

    def check_passed(self, check):
        """Wait for a :class:`StepCheck` and raise its error, if any."""
        self.wait(check)
        if check.error is not None:
            raise check.error


def release(handles, engine):
    """Remove an owner's gradient hooks and retire its engine (a finalizer: no MPI call)."""
    for handle in handles:
        handle.remove()
    engine.retire()


def decision_stats(communicator):
    """What ran and why, for the ``communication_stats()`` of ``ccl.torch``'s objects.

    Parameters
    ----------
    communicator : ccl.Communicator
        The communicator their buckets are reduced with.

    Returns
    -------
    dict
        ``bytes_compressed`` and ``bytes_plain`` (what this rank sent
        compressed, and uncompressed: ``auto`` keeps buckets plain where
        compressing would not pay), ``algorithms`` (``{algorithm: calls}``,
        ``auto`` resolved), ``decisions`` (``{algorithm: {reason: calls}}``)
        and ``auto`` (the link speed, latency, nodes and share of a core
        ``auto`` decided from; None until a call needed them): see
        :meth:`ccl.Communicator.stats`.
    """
    stats = communicator.stats()
    return {name: stats[name] for name in ("bytes_compressed", "bytes_plain", "algorithms",
                                           "decisions", "auto")}

