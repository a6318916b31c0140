"""The communication side of ``ccl.torch``: a private communicator and one background thread.

An :class:`Engine` runs :class:`Job` objects (one bucket's allreduce each)
strictly in the order they were submitted, the same order on every rank, on a
duplicate of ``ccl.torch``'s communicator that no other thread uses. Without
``MPI_THREAD_MULTIPLE`` the jobs run in the calling thread when waited for.
"""

import queue
import threading

from ..api import Communicator
from .runtime import threads_supported

__all__ = ["Job", "Engine", "release", "decision_stats"]


class Job:
    """One bucket's reduction: input, options, and the result or error once done."""

    __slots__ = ("x", "key", "codec", "algorithm", "lr", "result", "error", "done", "on_done")

    def __init__(self, x, key, codec=None, algorithm=None, on_done=None, lr=None):
        self.x, self.key, self.codec, self.algorithm = x, key, codec, algorithm
        self.lr = lr  # the learning rate of lr-corrected error feedback (None: not corrected)
        self.result = self.error = None
        self.done = threading.Event()
        self.on_done = on_done  # called with the job once it is done, in the thread that ran it

    def run(self, communicator):
        try:
            if self.lr is not None:  # lr-corrected error feedback, on the thread that reduces
                communicator.set_lr(self.lr)
            self.result = communicator.allreduce(self.x, key=self.key, codec=self.codec,
                                                 algorithm=self.algorithm)
        except BaseException as exc:  # handed to the thread that waits for the job
            self.error = exc
        finally:
            self.done.set()
        if self.on_done is not None:
            self.on_done(self)


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
        self._jobs = queue.SimpleQueue()
        self._inline = []
        self._thread = None
        if threads_supported():
            self._thread = threading.Thread(target=_serve, args=(self._jobs, self.communicator),
                                            name="ccl.torch-comm", daemon=True)
            self._thread.start()
        self.retired = runtime.retired
        self.number = runtime.register(self)

    @property
    def threaded(self):
        """Whether jobs run in the background thread (else in :meth:`wait`'s caller)."""
        return self._thread is not None

    def submit(self, job):
        """Queue a job; jobs run in submission order."""
        if self.closed:
            raise RuntimeError("ccl.torch was shut down: this optimizer (or DDP hook) cannot "
                               "reduce gradients any more")
        self.reductions += 1
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
        self.retired.put(self.number)

    def join(self, timeout=None):
        """Stop the thread once its queued jobs are done and wait for it (no MPI call here)."""
        self.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def close(self):
        """Finish queued jobs, stop the thread and free the communicator (collective)."""
        if self.closed:
            return
        self.closed = True
        self.join()
        for job in self._inline:
            job.run(self.communicator)
        self._inline = []
        self.comm.Free()



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

