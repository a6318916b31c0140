"""The communication of ``CompressedAdam``: buckets that start during backward.

A ``post_accumulate_grad`` hook per parameter hands the parameter's final
gradient of this step (after ``backward_passes_per_step`` backward passes) to
the optimizer, which folds it into what the parameter sends: the gradient
itself during the warm-up, after it the rank's local momentum divided by the
frozen denominator (:func:`preconditioner`) and limited to exact Adam's
bound (:func:`step_bound`; why: :mod:`ccl.torch.adam`). That goes into
the parameter's bucket's flat buffer. A complete bucket is handed to the
:class:`~ccl.torch.engine.Engine` as soon as every bucket before it in launch
order has been, so the reductions of the last layers run while backward is
still computing the first layers' gradients.

Launch order is fixed at construction and is the same on every rank, whatever
the timing of backward: the compressed buckets from the last parameters to the
first (the order in which backward produces gradients), then the parameters
too small to compress, one bucket per dtype. :meth:`MomentumReducer.finish`
starts what backward did not (parameters without a gradient send zeros) and
waits for every bucket.
"""

import math
import threading
import weakref

import numpy as np
import torch

from .engine import Census, Engine, Job, release
from .functions import from_array, to_array
from .hooks import Bucket, BucketHooks

__all__ = ["MomentumReducer", "preconditioner", "step_bound", "check_adam_group"]


def step_bound(beta1, beta2, t):
    """The largest ``|m_hat / sqrt(v_hat)|`` exact Adam can reach at step ``t``, any gradients.

    With ``m_t = (1 - beta1) sum_k beta1^k g_(t-k)`` and ``v_t = (1 - beta2)
    sum_k beta2^k g_(t-k)^2`` (``k < t``), the Cauchy-Schwarz inequality with
    the weights ``beta2^k`` gives ``m_t^2 <= (1 - beta1)^2 / (1 - beta2)
    sum_k (beta1^2 / beta2)^k v_t``, an equality for some gradients. After
    bias correction::

        B_t = (1 - beta1) / (1 - beta1^t)
              * sqrt((1 - beta2^t) sum_(k<t) (beta1^2 / beta2)^k / (1 - beta2))

    ``B_1 = 1`` (Adam's first step is ``lr`` per coordinate); with the
    default betas (0.9, 0.999) ``B_t`` rises to about 7.3.

    Parameters
    ----------
    beta1, beta2 : float
        The betas, in [0, 1).
    t : int
        The step, >= 1.

    Returns
    -------
    float
    """
    rho = beta1 * beta1 / beta2 if beta2 > 0 else (0.0 if beta1 == 0 else float("inf"))
    if rho == 0:
        weights = 1.0
    elif rho == 1:
        weights = float(t)
    elif rho > 1 and t * math.log(rho) > 700:  # beta1^2 > beta2, a late step: no bound
        return float("inf")
    else:
        weights = (1 - rho ** t) / (1 - rho)
    return (1 - beta1) / (1 - beta1 ** t) * math.sqrt((1 - beta2 ** t) * weights / (1 - beta2))


def preconditioner(v, beta2, frozen, eps):
    """The denominator ``d = sqrt(v / (1 - beta2^frozen)) + eps`` of a frozen variance ``v``.

    Coordinates whose variance is zero get ``inf``: their preconditioned
    momentum ``m / d`` is zero, whatever their momentum.

    Parameters
    ----------
    v : torch.Tensor
        The variance (``exp_avg_sq``), frozen at step ``frozen``.
    beta2 : float
        Its decay rate.
    frozen : int
        The step it was frozen at, >= 1.
    eps : float
        Added to the root.

    Returns
    -------
    torch.Tensor
        A new tensor shaped like ``v``.
    """
    denom = (v.sqrt() / (1 - beta2 ** frozen) ** 0.5).add_(eps)
    return denom.masked_fill_(v == 0, float("inf"))


class MomentumReducer(BucketHooks):
    """Hooks, flat buffers and launches of one ``CompressedAdam`` (collective to make).

    Parameters
    ----------
    optimizer : ccl.torch.CompressedAdam
        The owner (held weakly): it says whether the step is a warm-up step,
        folds gradients into momenta and gives each bucket's learning rate.
    runtime : object
        The initialised ``ccl.torch``; the engine duplicates its communicator.
    compressed : list of list of int
        The compressed buckets, as indices into ``optimizer.params``, in
        parameter order.
    keys : list of str
        Each compressed bucket's error-feedback key.
    passes : int
        Backward passes per step (gradient accumulation).
    codec, algorithm, lr_corrected
        The engine's :class:`ccl.Communicator` settings for compressed buckets.
    """

    drop_advice = "optimizer.skip_step() drops a step"

    def __init__(self, optimizer, runtime, compressed, keys, passes, codec, algorithm,
                 lr_corrected):
        self.owner = weakref.ref(optimizer)
        self.params = optimizer.params
        self.passes = passes
        self.engine = Engine(runtime, codec, algorithm, "mean", min_compress_bytes=0,
                             lr_corrected=lr_corrected)
        self.engine.what = "CompressedAdam"
        self.lock = threading.RLock()
        taken = {i for members in compressed for i in members}
        exact = {}
        for i, p in enumerate(self.params):
            if i not in taken:
                exact.setdefault(p.dtype, []).append(i)
        # launch order: compressed buckets last parameter first, then the small ones
        self.buckets = [self._bucket(members, key)
                        for members, key in reversed(list(zip(compressed, keys)))]
        self.buckets += [self._bucket(members, None) for members in exact.values()]
        self.bucket_of, self.offset_of = {}, {}
        for bucket in self.buckets:
            offset = 0
            for i in bucket.members:
                self.bucket_of[i], self.offset_of[i] = bucket, offset
                offset += self.params[i].numel()
        self._handles = self.hook(range(len(self.params)))
        weakref.finalize(self, release, self._handles, self.engine)
        self.reset()

    def _bucket(self, members, key):
        first = self.params[members[0]]
        numel = sum(self.params[i].numel() for i in members)
        # key None: reduced uncompressed in every phase
        return Bucket(members, torch.zeros(numel, dtype=first.dtype, device=first.device), key)

    # ------------------------------------------------------------- backward
    def param_name(self, i):
        return self.owner().names[i]

    def fill(self, i):
        """Fold parameter ``i``'s gradient (zeros if none); copy what it sends into the bucket."""
        p, bucket = self.params[i], self.bucket_of[i]
        start = self.offset_of[i]
        with torch.no_grad():
            sent = self.owner()._fold(p)
            bucket.flat[start:start + p.numel()].copy_(sent.reshape(-1))
        return bucket

    def launch(self, bucket):
        optimizer = self.owner()
        if bucket.key is None or optimizer._in_warmup():
            # exact: the MPI library's own Allreduce (no error feedback)
            job = Job(to_array(bucket.flat), None, codec="none", algorithm="mpi")
        else:
            job = Job(to_array(bucket.flat), bucket.key,
                      lr=optimizer._lr_of(self.params[bucket.members[0]]))
        bucket.job = job
        self.submit(job)

    # ----------------------------------------------------------------- step
    def finish(self, flag=0):
        """Start what backward did not, wait for every bucket; return the means (collective).

        Then the ranks exchange one small row (the MPI library's exact
        allreduce): each rank's ``flag`` and which parameters have a gradient.

        Parameters
        ----------
        flag : int
            This rank's flags for the step (bits the optimizer defines).

        Returns
        -------
        means : list of (int, torch.Tensor)
            Per parameter index, the mean over the ranks of what it sent
            (a view of a fresh tensor, shaped like the parameter).
        flags : numpy.ndarray
            Every rank's ``flag``, by rank.
        anywhere : numpy.ndarray
            Per parameter index, whether some rank has a gradient for it.

        Raises
        ------
        Exception
            What a reduction raised (on every rank, as the collectives do).
        """
        with self.lock:
            for bucket in self.buckets[self.next_launch:]:
                for i in bucket.members:
                    if not self.ready[i]:
                        self.take(i)
                self.launch(bucket)
            self.next_launch = len(self.buckets)
            size = self.engine.communicator.size
            row = np.zeros(size + len(self.params))
            row[self.engine.communicator.rank] = flag
            row[size:] = [p.grad is not None for p in self.params]
            census = Census(row, None, codec="none", algorithm="mpi")  # averaged: times size
            self.submit(census)
            for bucket in self.buckets:
                self.engine.wait(bucket.job)
            self.engine.wait(census)
            jobs = (self.check, *(bucket.job for bucket in self.buckets), census)
            error = next((job.error for job in jobs if job.error is not None), None)
            means = flags = anywhere = None
            if error is None:
                table = np.rint(census.result * size).astype(np.int64)
                flags, anywhere = table[:size], table[size:] > 0
                means = []
                for bucket in self.buckets:
                    result = from_array(bucket.job.result, like=bucket.flat)
                    for i in bucket.members:
                        p, start = self.params[i], self.offset_of[i]
                        means.append((i, result[start:start + p.numel()].view(p.shape)))
            self.reset()
        if error is not None:
            raise error
        return means, flags, anywhere


def _check_number(name, value, low, high=float("inf"), high_open=False):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value \
        and (value < high if high_open else value <= high)
    if not ok:
        raise ValueError(f"{name} must be a number in [{low}, {high}{')' if high_open else ']'}, "
                         f"got {value!r}")


def check_adam_group(group):
    """Validate one parameter group of Adam's hyperparameters.

    Parameters
    ----------
    group : dict
        ``lr``, ``betas``, ``eps`` and ``weight_decay``.

    Raises
    ------
    ValueError
        Saying what is accepted.
    """
    _check_number("lr", group["lr"], 0.0)
    betas = group["betas"]
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    _check_number("betas[0]", betas[0], 0.0, 1.0, high_open=True)
    _check_number("betas[1]", betas[1], 0.0, 1.0, high_open=True)
    _check_number("eps", group["eps"], 0.0)
    _check_number("weight_decay", group["weight_decay"], 0.0)
