"""Gradient hooks that start buckets during backward, in an order fixed for every rank.

Both optimizers reduce parameters in buckets, each one flat array, and start
a bucket's reduction inside backward once every member's gradient is final
for the step (after ``backward_passes_per_step`` passes). Ranks must start
the same reductions in the same order whatever the timing of their backward
passes, so a complete bucket starts only after every bucket before it in
the fixed launch order; what backward leaves is started by the step itself.
:class:`BucketHooks` is that bookkeeping; the subclasses say what a
parameter puts into its bucket (:meth:`BucketHooks.fill`) and how a bucket
is reduced (:meth:`BucketHooks.launch`).
"""

import weakref

from .engine import STEP, StepCheck

__all__ = ["Bucket", "BucketHooks"]


class Bucket:
    """Parameters reduced as one flat array, and the reduction of the step in progress.

    Parameters
    ----------
    members : list of int
        The parameters' positions in the owner's parameter list, in order.
    flat : torch.Tensor
        The flat buffer the parameters' contributions are copied into.
    key : str or None
        The error-feedback key; None: reduced uncompressed, without error feedback.
    codec, algorithm : optional
        How it is reduced, where the owner does not decide at launch.
    """

    __slots__ = ("members", "flat", "key", "codec", "algorithm", "missing", "job")

    def __init__(self, members, flat, key=None, codec=None, algorithm=None):
        self.members, self.flat, self.key = members, flat, key
        self.codec, self.algorithm = codec, algorithm
        self.missing = len(members)  # parameters whose contribution is not in flat yet
        self.job = None  # the reduction of this step, once started


class BucketHooks:
    """Backward passes counted per parameter; complete buckets started in launch order.

    Attributes
    ----------
    drop_advice : str
        How the owner drops a step, for messages.

    Subclasses set ``params`` (the parameters, indexed like the hooks),
    ``passes`` (backward passes per step), ``buckets`` (:class:`Bucket`, in
    launch order),
    ``lock`` (a ``threading.RLock``) and ``engine`` (whose ``steps`` and
    ``what`` the step check reports), and define :meth:`fill`,
    :meth:`launch` and :meth:`param_name`.

    Each step starts with a :class:`~ccl.torch.engine.StepCheck` submitted
    before its first bucket: ranks at different steps (or some ranks shut
    down) raise :class:`ccl.MismatchError` instead of pairing one step's
    collectives with another's.
    """

    drop_advice = "optimizer.synchronize() then optimizer.zero_grad() drops a step"

    def hook(self, indices):
        """Register the gradient hook of the parameters at ``indices``.

        Parameters
        ----------
        indices : iterable of int
            Positions in ``params``.

        Returns
        -------
        list
            The hook handles (``handle.remove()`` unregisters).
        """
        ref = weakref.ref(self)  # a hook must not keep its owner alive
        return [self.params[i].register_post_accumulate_grad_hook(
            lambda _, i=i: _on_grad(ref, i)) for i in indices]

    def reset(self):
        """Forget this step: no pass counted, no bucket filled or started."""
        self.remaining = [self.passes] * len(self.params)
        self.ready = [False] * len(self.params)
        for bucket in self.buckets:
            bucket.missing, bucket.job = len(bucket.members), None
        self.next_launch = 0
        self.dirty = False  # a hook fired since the last reset
        self.check = None  # this step's StepCheck, submitted with its first bucket

    def step_check(self):
        """This step's check, submitted now if no bucket of the step started yet.

        Returns
        -------
        ccl.torch.engine.StepCheck
            Carries ``engine.steps``, the steps completed on this rank.
        """
        if self.check is None:
            self.check = StepCheck(self.engine.what, STEP, self.engine.steps)
            self.engine.submit(self.check)
        return self.check

    def submit(self, job):
        """Submit a bucket's job, after the step's check (which it skips if the check failed).

        Parameters
        ----------
        job : ccl.torch.engine.Job
        """
        job.gate = self.step_check()
        self.engine.submit(job)

    @property
    def pending(self):
        """Whether a gradient arrived or a bucket started since the last :meth:`reset`."""
        return self.dirty or any(bucket.job is not None for bucket in self.buckets)

    def on_grad(self, i):
        """A gradient was accumulated into parameter ``i`` (runs inside backward).

        Parameters
        ----------
        i : int
            Position in ``params``.

        Raises
        ------
        RuntimeError
            If the parameter got more than ``passes`` gradients this step.
        """
        with self.lock:
            self.dirty = True
            if self.ready[i]:
                raise RuntimeError(
                    f"the gradient of {self.param_name(i)!r} was computed more than "
                    f"backward_passes_per_step={self.passes} times before the step reduced "
                    f"it: call optimizer.step() after every {self.passes} backward pass(es) "
                    f"({self.drop_advice}), or raise backward_passes_per_step to accumulate "
                    "more backward passes locally")
            self.remaining[i] -= 1
            if self.remaining[i] > 0:
                return
            self.take(i)
            self.launch_complete()

    def take(self, i):
        """Put parameter ``i``'s contribution into its bucket (:meth:`fill`) and count it.

        Parameters
        ----------
        i : int
            Position in ``params``.
        """
        self.fill(i).missing -= 1
        self.ready[i] = True

    def launch_complete(self):
        """Start complete buckets in launch order, up to the first incomplete one."""
        while self.next_launch < len(self.buckets) and \
                self.buckets[self.next_launch].missing == 0:
            self.launch(self.buckets[self.next_launch])
            self.next_launch += 1

    # ------------------------------------------------------- for the subclasses
    def fill(self, i):
        """Copy what parameter ``i`` sends this step into its bucket; return the bucket.

        Parameters
        ----------
        i : int
            Position in ``params``.

        Returns
        -------
        object
            The parameter's bucket.
        """
        raise NotImplementedError

    def launch(self, bucket):
        """Start ``bucket``'s reduction (sets ``bucket.job``).

        Parameters
        ----------
        bucket : object
            One of ``buckets``, complete.
        """
        raise NotImplementedError

    def param_name(self, i):
        """The name of parameter ``i``, for messages.

        Parameters
        ----------
        i : int
            Position in ``params``.

        Returns
        -------
        str
        """
        raise NotImplementedError


def _on_grad(ref, i):
    owner = ref()
    if owner is not None:
        owner.on_grad(i)
